// Crafted models whose dimensions multiply past int64 (issue 23): each is refused at import with
// kInvalidArgument and a message naming the node or tensor and saying that the product
// overflows, before anything is sized by the wrapped count. Before the checks, a Reshape of
// [1,4] to [4611686018427387905,4] passed (the count wraps to 4) and the layer after it read
// far past a 16-byte buffer.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backplane/onnx/network.hpp"
#include "model_builder.hpp"

namespace backplane {
namespace {

using ::backplane::testing::ModelBuilder;
using ::backplane::testing::SetInt;
using ::backplane::testing::SetInts;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// 2^62 + 1: times 4 it is 2^64 + 4, which wraps to 4 in int64 arithmetic.
constexpr int64_t kWrapsToOneQuarter = (int64_t{1} << 62) + 1;

void ExpectOverflow(const Result<Network>& result, const std::string& names) {
  ASSERT_FALSE(result.ok()) << "import succeeded";
  EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument) << result.error().ToString();
  EXPECT_THAT(result.error().message(), AllOf(HasSubstr(names), HasSubstr("overflows")));
}

// x[1,4] -> Reshape to `shape` -> r, then the layers `follow` adds from r to y.
template <typename Follow>
ModelBuilder ReshapeThen(std::vector<int64_t> shape, Follow follow) {
  ModelBuilder model;
  model.Input("x", {1, 4}).OutputNoShape("y");
  const auto rank = static_cast<int64_t>(shape.size());
  model.Int64Initializer("shape", {rank}, std::move(shape));
  model.Node("Reshape", {"x", "shape"}, {"r"}, "reshape");
  follow(model);
  return model;
}

TEST(ShapeOverflowTest, RefusesReshapeThatWrapsBeforeGemm) {
  auto model = ReshapeThen({kWrapsToOneQuarter, 4}, [](ModelBuilder& m) {
    m.FloatInitializer("w", {4, 4});
    m.Node("Gemm", {"r", "w"}, {"y"}, "gemm");
  });
  ExpectOverflow(model.Import(), "node 'reshape' (Reshape)");
}

TEST(ShapeOverflowTest, RefusesReshapeThatWrapsBeforeConv) {
  auto model = ReshapeThen({1, 1, kWrapsToOneQuarter, 4}, [](ModelBuilder& m) {
    m.FloatInitializer("w", {1, 1, 1, 1});
    m.Node("Conv", {"r", "w"}, {"y"}, "conv");
  });
  ExpectOverflow(model.Import(), "node 'reshape' (Reshape)");
}

TEST(ShapeOverflowTest, RefusesReshapeThatWrapsBeforeSoftmax) {
  auto model = ReshapeThen({kWrapsToOneQuarter, 4}, [](ModelBuilder& m) {
    SetInt(m.Node("Softmax", {"r"}, {"y"}, "softmax"), "axis", 0);
  });
  ExpectOverflow(model.Import(), "node 'reshape' (Reshape)");
}

TEST(ShapeOverflowTest, RefusesReshapeThatWrapsBeforeTranspose) {
  auto model = ReshapeThen({kWrapsToOneQuarter, 4}, [](ModelBuilder& m) {
    SetInts(m.Node("Transpose", {"r"}, {"y"}, "transpose"), "perm", {1, 0});
  });
  ExpectOverflow(model.Import(), "node 'reshape' (Reshape)");
}

TEST(ShapeOverflowTest, RefusesReshapeWhoseInferredDimensionHidesAnOverflow) {
  // The known dims multiply to 2^64 + 4, which wraps to 4: the -1 would resolve to 1.
  auto model = ReshapeThen({-1, kWrapsToOneQuarter, 4},
                           [](ModelBuilder& m) { m.Node("Relu", {"r"}, {"y"}, "relu"); });
  ExpectOverflow(model.Import(), "node 'reshape' (Reshape)");
}

TEST(ShapeOverflowTest, RefusesInputDeclaredWithOverflowingDimensions) {
  ModelBuilder model;
  model.Input("x", {int64_t{1} << 62, 4}).Output("y", {int64_t{1} << 62, 4});
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectOverflow(model.Import(), "graph input 'x'");
}

TEST(ShapeOverflowTest, RefusesInputWhoseCountWrapsNegativeWithoutPrintingIt) {
  // 3037000500^2 wraps to -9223372036709301616, which an error message once printed as a count.
  ModelBuilder model;
  model.Input("x", {3037000500, 3037000500}).OutputNoShape("y");
  model.Int64Initializer("shape", {1}, {7});
  model.Node("Reshape", {"x", "shape"}, {"y"}, "reshape");
  auto result = model.Import();
  ExpectOverflow(result, "graph input 'x'");
  if (!result.ok()) {
    EXPECT_THAT(result.error().message(), Not(HasSubstr("-9223372036709301616")));
  }
}

TEST(ShapeOverflowTest, RefusesHugeDeclaredInputBeforeAnyRequest) {
  // No overflow, but 2^60 elements: no buffer of it could ever be allocated.
  ModelBuilder model;
  model.Input("x", {int64_t{1} << 30, int64_t{1} << 30}).OutputNoShape("y");
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectOverflow(model.Import(), "graph input 'x'");
}

TEST(ShapeOverflowTest, RefusesDynamicInputWhoseKnownDimensionsOverflow) {
  ModelBuilder model;
  model.Input("x", {-1, int64_t{1} << 31, int64_t{1} << 31}).OutputNoShape("y");
  model.Node("Relu", {"x"}, {"y"}, "relu");
  ExpectOverflow(model.Import(), "graph input 'x'");
}

TEST(ShapeOverflowTest, RefusesInitializerWhoseDimensionsOverflow) {
  ModelBuilder model;
  model.Input("x", {2, 2}).OutputNoShape("y");
  auto* w = model.proto().mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(kWrapsToOneQuarter);
  w->add_dims(4);
  for (int i = 0; i < 4; ++i)
    w->add_float_data(1.0f);  // what the wrapped count asks for
  model.Node("Add", {"x", "w"}, {"y"}, "add");
  ExpectOverflow(model.Import(), "initializer 'w'");
}

TEST(ShapeOverflowTest, RefusesInitializerWhoseDataDisagreesWithItsDimensions) {
  ModelBuilder model;
  model.Input("x", {2, 3}).OutputNoShape("y");
  auto* w = model.proto().mutable_graph()->add_initializer();
  w->set_name("w");
  w->set_data_type(onnx::TensorProto::FLOAT);
  w->add_dims(int64_t{1} << 20);
  w->add_dims(int64_t{1} << 20);
  w->set_raw_data(std::string(24, '\0'));
  model.Node("Add", {"x", "w"}, {"y"}, "add");
  auto result = model.Import();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(result.error().message(),
              AllOf(HasSubstr("initializer 'w'"), HasSubstr("24 bytes of raw_data")));
}

TEST(ShapeOverflowTest, RefusesNegativeDimensionsFromTheModel) {
  {
    ModelBuilder model;
    model.Input("x", {2, 2}).OutputNoShape("y");
    model.proto()
        .mutable_graph()
        ->mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(1)
        ->set_dim_value(-3);
    model.Node("Relu", {"x"}, {"y"}, "relu");
    auto result = model.Import();
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.error().message(),
                AllOf(HasSubstr("graph input 'x'"), HasSubstr("negative dimension -3")));
  }
  {
    ModelBuilder model;
    model.Input("x", {2, 2}).OutputNoShape("y");
    model.Int64Initializer("w", {2, -2}, {1, 2, 3, 4});
    model.Node("Add", {"x", "w"}, {"y"}, "add");
    auto result = model.Import();
    ASSERT_FALSE(result.ok());
    EXPECT_THAT(result.error().message(),
                AllOf(HasSubstr("initializer 'w'"), HasSubstr("negative dimension -2")));
  }
  {
    // A negative kernel_shape once passed as an "unknown" dimension and left the pool's output
    // unresolved for every request.
    ModelBuilder model;
    model.Input("x", {1, 1, 8, 8}).OutputNoShape("y");
    SetInts(model.Node("MaxPool", {"x"}, {"y"}, "pool"), "kernel_shape", {-2, 2});
    auto result = model.Import();
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.error().message(),
                AllOf(HasSubstr("node 'pool' (MaxPool)"), HasSubstr("kernel")));
  }
}

TEST(ShapeOverflowTest, RefusesWindowAttributesThatOverflow) {
  const int64_t huge = int64_t{1} << 62;
  {
    // (kernel - 1) * dilation + 1 overflows.
    ModelBuilder model;
    model.Input("x", {1, 1, 8}).OutputNoShape("y");
    auto& pool = model.Node("MaxPool", {"x"}, {"y"}, "pool");
    SetInts(pool, "kernel_shape", {5});
    SetInts(pool, "dilations", {huge});
    ExpectOverflow(model.Import(), "node 'pool' (MaxPool)");
  }
  {
    // input + pads overflows.
    ModelBuilder model;
    model.Input("x", {1, 1, 8}).OutputNoShape("y");
    auto& pool = model.Node("MaxPool", {"x"}, {"y"}, "pool");
    SetInts(pool, "kernel_shape", {1});
    SetInts(pool, "pads", {huge, huge});
    ExpectOverflow(model.Import(), "node 'pool' (MaxPool)");
  }
  {
    // Each kernel dim fits, but the window's 2^63 taps do not (a huge stride keeps the output
    // at one position).
    ModelBuilder model;
    model.Input("x", {1, 1, 1, 1, 1}).OutputNoShape("y");
    auto& pool = model.Node("MaxPool", {"x"}, {"y"}, "pool");
    const int64_t k = int64_t{1} << 21;
    SetInts(pool, "kernel_shape", {k, k, k});
    SetInts(pool, "pads", {k, k, k, k, k, k});
    SetInts(pool, "strides", {int64_t{1} << 40, int64_t{1} << 40, int64_t{1} << 40});
    ExpectOverflow(model.Import(), "node 'pool' (MaxPool)");
  }
  {
    // W's channels times group would wrap to X's 4 channels: refused without computing it.
    ModelBuilder model;
    model.Input("x", {1, 4, 8}).OutputNoShape("y");
    model.FloatInitializer("w", {4, 4, 1});
    SetInt(model.Node("Conv", {"x", "w"}, {"y"}, "conv"), "group", kWrapsToOneQuarter);
    auto result = model.Import();
    ASSERT_FALSE(result.ok()) << "import succeeded";
    EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(result.error().message(), HasSubstr("node 'conv' (Conv)"));
  }
}

TEST(ShapeOverflowTest, RefusesRequestShapeThatOverflows) {
  ModelBuilder model;
  model.Input("x", {-1, 4}).OutputNoShape("y");
  model.Node("Relu", {"x"}, {"y"}, "relu");
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const std::vector<TensorInfo> inputs = {{DataType::kFloat32, {kWrapsToOneQuarter, 4}}};
  auto values = InferShapes(*network, inputs);
  ASSERT_FALSE(values.ok()) << "InferShapes accepted " << ToString(inputs[0].shape);
  EXPECT_EQ(values.error().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(values.error().message(), AllOf(HasSubstr("input 'x'"), HasSubstr("overflows")));
}

TEST(ShapeOverflowTest, RefusesRequestWhoseConcatOverflows) {
  // Each input is within the bound; their concatenation is not.
  ModelBuilder model;
  model.Input("a", {-1, 1}).Input("b", {-1, 1}).OutputNoShape("y");
  SetInt(model.Node("Concat", {"a", "b"}, {"y"}, "concat"), "axis", 0);
  auto network = model.Import();
  ASSERT_TRUE(network.ok()) << network.error().ToString();
  const int64_t at_bound = int64_t{1} << 40;
  const std::vector<TensorInfo> inputs = {{DataType::kFloat32, {at_bound, 1}},
                                          {DataType::kFloat32, {at_bound, 1}}};
  auto values = InferShapes(*network, inputs);
  ASSERT_FALSE(values.ok());
  EXPECT_THAT(values.error().message(),
              AllOf(HasSubstr("node 'concat' (Concat)"), HasSubstr("overflows")));
}

// The exact product of `dims` without overflow, saturated at 2^62 (above the bound either way).
int64_t SaturatedProduct(const std::vector<int64_t>& dims) {
  constexpr int64_t kSaturation = int64_t{1} << 62;
  int64_t product = 1;
  for (int64_t dim : dims) {
    if (dim <= 0)
      continue;
    if (product > kSaturation / dim)  // product * dim > 2^62, checked without computing it
      return kSaturation;
    product *= dim;
  }
  return product;
}

// Random shapes with large dimensions through Reshape, Flatten and Transpose: each model is
// either refused for overflow, exactly when the true product exceeds the bound, or imported with
// exactly the true element counts.
TEST(ShapeOverflowTest, RandomLargeShapesAreRefusedOrCountedExactly) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (use it instead of random_device to reproduce)");
  std::mt19937 rng(seed);
  const std::vector<int64_t> interesting = {1,
                                            2,
                                            3,
                                            4,
                                            7,
                                            1000,
                                            3037000500,
                                            kWrapsToOneQuarter,
                                            (int64_t{1} << 20) + 1,
                                            int64_t{1} << 20,
                                            int64_t{1} << 31,
                                            int64_t{1} << 32,
                                            (int64_t{1} << 40),
                                            (int64_t{1} << 40) + 1,
                                            INT64_MAX};
  auto random_dim = [&] { return interesting[rng() % interesting.size()]; };
  constexpr int64_t kBound = int64_t{1} << 40;
  for (int iteration = 0; iteration < 500; ++iteration) {
    std::vector<int64_t> input(1 + rng() % 3);
    for (auto& dim : input)
      dim = random_dim();
    std::vector<int64_t> target(1 + rng() % 3);
    for (auto& dim : target)
      dim = random_dim();
    // Make the target's true count equal the input's when it can, so that a refusal is for
    // size, not for differing counts.
    const int64_t input_count = SaturatedProduct(input);
    const int64_t target_rest = SaturatedProduct({target.begin() + 1, target.end()});
    const bool use_minus_one = rng() % 2 == 0;
    if (use_minus_one)
      target[0] = -1;
    else if (input_count <= kBound && input_count % target_rest == 0)
      target[0] = input_count / target_rest;
    SCOPED_TRACE("iteration " + std::to_string(iteration) + ": " + ToString(input) + " to " +
                 ToString(target));

    ModelBuilder model;
    model.Input("x", input).OutputNoShape("y");
    model.Int64Initializer("shape", {static_cast<int64_t>(target.size())}, target);
    model.Node("Reshape", {"x", "shape"}, {"r"}, "reshape");
    SetInt(model.Node("Flatten", {"r"}, {"f"}, "flatten"), "axis", 1);
    model.Node("Transpose", {"f"}, {"y"}, "transpose");
    auto result = model.Import();

    const bool input_fits = input_count <= kBound;
    const bool target_fits = SaturatedProduct(target) <= kBound;  // a -1 is not counted
    if (!input_fits || !target_fits) {
      ASSERT_FALSE(result.ok()) << "accepted a shape of more than 2^40 elements";
      EXPECT_EQ(result.error().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(result.error().message(), HasSubstr("overflows"));
      continue;
    }
    if (!result.ok()) {
      // Within the bound, only differing counts may be refused, and never as an overflow.
      EXPECT_THAT(result.error().message(),
                  AllOf(HasSubstr("cannot reshape"), Not(HasSubstr("overflows"))));
      continue;
    }
    for (const auto& [name, info] : result->values) {
      if (name == "shape")
        continue;  // Reshape's shape, a constant of its own size
      int64_t count = 1;
      for (int64_t dim : info.shape) {
        ASSERT_GE(dim, 0) << name;
        count *= dim;  // safe: the true count is at most the input's, checked above
      }
      EXPECT_EQ(count, input_count) << name << " " << ToString(info.shape);
    }
  }
}

}  // namespace
}  // namespace backplane
