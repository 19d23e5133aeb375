// TensorProto files: round trips through a temporary directory, and the typed-field encoding.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class NetworkTensorProtoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device random;
    directory_ =
        std::filesystem::temp_directory_path() / ("backplane-tensor-" + std::to_string(random()));
    std::filesystem::create_directories(directory_);
  }
  void TearDown() override { std::filesystem::remove_all(directory_); }

  std::filesystem::path directory_;
};

TEST_F(NetworkTensorProtoTest, Float32RoundTrip) {
  Tensor tensor(TensorInfo{DataType::kFloat32, {2, 3}});
  for (std::size_t i = 0; i < 6; ++i)
    tensor.Elements<float>()[i] = static_cast<float>(i) - 2.5f;
  const auto path = directory_ / "input_0.pb";
  ASSERT_TRUE(WriteTensorProtoFile(path, tensor, "x").ok());
  auto read = ReadTensorProtoFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  EXPECT_EQ(read->info(), tensor.info());
  EXPECT_THAT(read->Elements<float>(), ElementsAre(-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f));

  // The file is a real TensorProto with the name given.
  onnx::TensorProto proto;
  std::ifstream file(path, std::ios::binary);
  ASSERT_TRUE(proto.ParseFromIstream(&file));
  EXPECT_EQ(proto.name(), "x");
  EXPECT_EQ(proto.data_type(), onnx::TensorProto::FLOAT);
}

TEST_F(NetworkTensorProtoTest, Int64RoundTrip) {
  Tensor tensor(TensorInfo{DataType::kInt64, {3}});
  tensor.Elements<int64_t>()[0] = -1;
  tensor.Elements<int64_t>()[1] = int64_t{1} << 40;
  tensor.Elements<int64_t>()[2] = 7;
  const auto path = directory_ / "shape.pb";
  ASSERT_TRUE(WriteTensorProtoFile(path, tensor, "shape").ok());
  auto read = ReadTensorProtoFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  EXPECT_EQ(read->info(), tensor.info());
  EXPECT_THAT(read->Elements<int64_t>(), ElementsAre(-1, int64_t{1} << 40, 7));
}

TEST_F(NetworkTensorProtoTest, ScalarRoundTrip) {
  Tensor tensor(TensorInfo{DataType::kFloat32, {}});
  tensor.Elements<float>()[0] = 3.0f;
  const auto path = directory_ / "scalar.pb";
  ASSERT_TRUE(WriteTensorProtoFile(path, tensor, "s").ok());
  auto read = ReadTensorProtoFile(path);
  ASSERT_TRUE(read.ok()) << read.error().ToString();
  EXPECT_TRUE(read->info().shape.empty());
  EXPECT_THAT(read->Elements<float>(), ElementsAre(3.0f));
}

TEST_F(NetworkTensorProtoTest, ReadsTypedFields) {
  onnx::TensorProto floats;
  floats.set_data_type(onnx::TensorProto::FLOAT);
  floats.add_dims(2);
  floats.add_float_data(1.25f);
  floats.add_float_data(-4.0f);
  onnx::TensorProto ints;
  ints.set_data_type(onnx::TensorProto::INT64);
  ints.add_dims(1);
  ints.add_dims(2);
  ints.add_int64_data(5);
  ints.add_int64_data(-6);
  for (const auto& [name, proto] : {std::pair{"floats.pb", floats}, std::pair{"ints.pb", ints}}) {
    std::ofstream file(directory_ / name, std::ios::binary);
    ASSERT_TRUE(proto.SerializeToOstream(&file));
  }
  auto read_floats = ReadTensorProtoFile(directory_ / "floats.pb");
  ASSERT_TRUE(read_floats.ok()) << read_floats.error().ToString();
  EXPECT_EQ(read_floats->info(), (TensorInfo{DataType::kFloat32, {2}}));
  EXPECT_THAT(read_floats->Elements<float>(), ElementsAre(1.25f, -4.0f));
  auto read_ints = ReadTensorProtoFile(directory_ / "ints.pb");
  ASSERT_TRUE(read_ints.ok()) << read_ints.error().ToString();
  EXPECT_EQ(read_ints->info(), (TensorInfo{DataType::kInt64, {1, 2}}));
  EXPECT_THAT(read_ints->Elements<int64_t>(), ElementsAre(5, -6));
}

TEST_F(NetworkTensorProtoTest, RefusesBadFiles) {
  auto missing = ReadTensorProtoFile(directory_ / "missing.pb");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);

  {
    std::ofstream file(directory_ / "garbage.pb", std::ios::binary);
    file << "\xff\xff\xff\xff";
  }
  auto garbage = ReadTensorProtoFile(directory_ / "garbage.pb");
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.error().message(), HasSubstr("protobuf parse failed"));

  onnx::TensorProto short_data;
  short_data.set_data_type(onnx::TensorProto::FLOAT);
  short_data.add_dims(3);
  short_data.add_float_data(1.0f);
  {
    std::ofstream file(directory_ / "short.pb", std::ios::binary);
    ASSERT_TRUE(short_data.SerializeToOstream(&file));
  }
  auto short_read = ReadTensorProtoFile(directory_ / "short.pb");
  ASSERT_FALSE(short_read.ok());
  EXPECT_THAT(short_read.error().message(), HasSubstr("1 float_data values for 3 elements"));

  onnx::TensorProto strings;
  strings.set_data_type(onnx::TensorProto::STRING);
  strings.add_string_data("a");
  {
    std::ofstream file(directory_ / "strings.pb", std::ios::binary);
    ASSERT_TRUE(strings.SerializeToOstream(&file));
  }
  auto string_read = ReadTensorProtoFile(directory_ / "strings.pb");
  ASSERT_FALSE(string_read.ok());
  EXPECT_EQ(string_read.error().code(), StatusCode::kUnimplemented);
  EXPECT_THAT(string_read.error().message(), HasSubstr("unsupported data type STRING"));
}

TEST_F(NetworkTensorProtoTest, WriteRefusesInconsistentTensor) {
  Tensor tensor(TensorInfo{DataType::kFloat32, {4}}, std::vector<std::byte>(8));
  Status status = WriteTensorProtoFile(directory_ / "bad.pb", tensor, "bad");
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("holds 8 bytes"));
}

}  // namespace
}  // namespace backplane
