// models/mnist_int8 (the MNIST classifier quantized by scripts/quantize_qdq.py) against the float
// model it came from: the three test images' labels, and the class of 1,000 images made from
// them (shifted by up to 3 pixels, noised), through Runtime preferring CpuAcc as the models'
// configs do.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "backplane/runtime/runtime.hpp"
#include "test_util.hpp"

namespace backplane {
namespace {

namespace fs = std::filesystem;

const fs::path kModels = fs::path(BACKPLANE_SOURCE_DIR) / "models";
const fs::path kMnistData = fs::path(BACKPLANE_SHARED_DATA) / "models" / "mnist";
constexpr int kSide = 28;

class QuantizedMnistTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BACKPLANE_REQUIRE_PATH(kMnistData);
    fs::create_symlink(BACKPLANE_CPU_REF, backends_.path() / "Backplane_CpuRef_backend.so");
    fs::create_symlink(BACKPLANE_CPU_ACC, backends_.path() / "Backplane_CpuAcc_backend.so");
    auto runtime = Runtime::Create({.backend_paths = std::vector{backends_.path()}});
    ASSERT_TRUE(runtime.ok()) << runtime.error().ToString();
    runtime_ = std::move(runtime).value();
    float_id_ = Load(kModels / "mnist" / "1" / "model.onnx");
    int8_id_ = Load(kModels / "mnist_int8" / "1" / "model.onnx");
    for (int set = 0; set < 3; ++set) {
      const fs::path data_set = kMnistData / ("test_data_set_" + std::to_string(set));
      auto image = ReadTensorProtoFile(data_set / "input_0.pb");
      auto label = ReadTensorProtoFile(data_set / "output_0.pb");
      ASSERT_TRUE(image.ok() && label.ok()) << data_set;
      images_.push_back(std::move(image).value());
      labels_.push_back(ArgMax(label.value()));  // one-hot
    }
  }

  NetworkId Load(const fs::path& model) {
    auto network = ImportOnnxFile(model);
    EXPECT_TRUE(network.ok()) << network.error().ToString();
    auto id = runtime_->LoadNetwork(std::move(network).value(),
                                    {.backend_preferences = {"CpuAcc", "CpuRef"}});
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    return id.ok() ? id.value() : NetworkId{};
  }

  static int ArgMax(const Tensor& tensor) {
    const auto values = tensor.Elements<float>();
    return static_cast<int>(std::max_element(values.begin(), values.end()) - values.begin());
  }

  int Classify(NetworkId id, const Tensor& image) {
    const std::vector<ConstTensorView> inputs{image.View()};
    auto outputs = runtime_->Execute(id, inputs);
    EXPECT_TRUE(outputs.ok()) << outputs.error().ToString();
    return outputs.ok() ? ArgMax((*outputs)[0]) : -1;
  }

  // `image` moved by (dy, dx) pixels, the uncovered border black, plus Gaussian noise of
  // `noise` gray levels, clamped to 0..255 as pixels are.
  static Tensor Distorted(const Tensor& image, int dy, int dx, float noise, std::mt19937_64& rng) {
    Tensor out(image.info());
    const auto in = image.Elements<float>();
    const auto pixels = out.Elements<float>();
    std::normal_distribution<float> jitter(0, noise);
    for (int y = 0; y < kSide; ++y) {
      for (int x = 0; x < kSide; ++x) {
        const int sy = y - dy, sx = x - dx;
        const float source =
            sy >= 0 && sy < kSide && sx >= 0 && sx < kSide ? in[sy * kSide + sx] : 0.0f;
        pixels[y * kSide + x] = std::clamp(source + jitter(rng), 0.0f, 255.0f);
      }
    }
    return out;
  }

  testing::TempDir backends_;
  std::unique_ptr<Runtime> runtime_;
  NetworkId float_id_{};
  NetworkId int8_id_{};
  std::vector<Tensor> images_;
  std::vector<int> labels_;
};

TEST_F(QuantizedMnistTest, AnswersTheTestImagesWithTheirLabels) {
  for (std::size_t i = 0; i < images_.size(); ++i)
    EXPECT_EQ(Classify(int8_id_, images_[i]), labels_[i]) << "test_data_set_" << i;
}

// Issue 43's bar: the quantized model agrees with the float one on >= 98 % of 1,000 inputs.
TEST_F(QuantizedMnistTest, AgreesWithTheFloatModelOnDistortedImages) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> shift(-3, 3);
  std::uniform_real_distribution<float> noise(0.0f, 24.0f);
  constexpr int kInputs = 1000;
  int agree = 0;
  for (int i = 0; i < kInputs; ++i) {
    const Tensor image =
        Distorted(images_[i % images_.size()], shift(rng), shift(rng), noise(rng), rng);
    agree += Classify(float_id_, image) == Classify(int8_id_, image);
  }
  RecordProperty("agreement", agree);
  std::printf("int8 agrees with float on %d of %d distorted images\n", agree, kInputs);
  EXPECT_GE(agree, kInputs * 98 / 100);
}

}  // namespace
}  // namespace backplane
