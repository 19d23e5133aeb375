// The bytes between host and worker: every SDK type reads back as written, on seeded random
// values, and no truncation or corruption of a message makes the reader go past its end.
#include <gtest/gtest.h>

#include <random>

#include "backplane/isolation/wire.hpp"
#include "test_util.hpp"

namespace backplane::isolation {
namespace {

OperatorDesc RandomOperator(std::mt19937_64& random, std::vector<std::vector<float>>& data) {
  auto count = [&](int most) { return std::uniform_int_distribution<int>(0, most)(random); };
  OperatorDesc op;
  op.op_type = "Op" + std::to_string(count(100));
  op.name = std::string(static_cast<std::size_t>(count(40)), 'n');
  for (int i = count(5); i > 0; --i) {
    const std::string key = "attr" + std::to_string(i);
    switch (count(4)) {
      case 0:
        op.attributes[key] = static_cast<int64_t>(random());
        break;
      case 1:
        op.attributes[key] = static_cast<float>(count(1000)) / 7;
        break;
      case 2:
        op.attributes[key] = std::string(static_cast<std::size_t>(count(20)), 'v');
        break;
      case 3:
        op.attributes[key] = std::vector<int64_t>(static_cast<std::size_t>(count(6)), -3);
        break;
      default:
        op.attributes[key] = std::vector<float>(static_cast<std::size_t>(count(6)), 0.5f);
    }
  }
  for (int i = count(4); i > 0; --i) {
    TensorInfo info{DataType::kFloat32, {}};
    for (int d = count(3); d > 0; --d)
      info.shape.push_back(1 + count(5));
    op.inputs.push_back(info);
    if (count(1) == 1) {
      data.emplace_back(static_cast<std::size_t>(info.ElementCount()));
      for (float& value : data.back())
        value = static_cast<float>(random() % 1000);
      op.constant_inputs.push_back(data.back().data());
    } else {
      op.constant_inputs.push_back(nullptr);
    }
  }
  op.outputs.push_back(TensorInfo{DataType::kInt64, {-1, 3}});
  return op;
}

void ExpectSame(const OperatorDesc& a, const OperatorDesc& b) {
  EXPECT_EQ(a.op_type, b.op_type);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.attributes, b.attributes);
  EXPECT_EQ(a.inputs, b.inputs);
  EXPECT_EQ(a.outputs, b.outputs);
  ASSERT_EQ(a.constant_inputs.size(), b.constant_inputs.size());
  for (std::size_t i = 0; i < a.constant_inputs.size(); ++i) {
    ASSERT_EQ(a.constant_inputs[i] == nullptr, b.constant_inputs[i] == nullptr);
    if (a.constant_inputs[i] != nullptr) {
      EXPECT_EQ(std::memcmp(a.constant_inputs[i], b.constant_inputs[i], a.inputs[i].ByteSize()), 0);
    }
  }
}

// A bool comes from the peer as a byte: 0 and 1 read back, anything else is out of range (under
// UBSan, copying 236 into a bool was undefined behaviour, found by the corruption rounds below).
TEST(WireTest, ABoolByteOtherThanZeroOrOneIsOutOfRange) {
  for (const auto& [byte, value] : {std::pair{0, false}, std::pair{1, true}}) {
    const std::byte bytes[] = {static_cast<std::byte>(byte)};
    WireReader in(bytes);
    EXPECT_EQ(in.Get<bool>(), value);
    EXPECT_TRUE(in.ok()) << byte;
  }
  for (const int byte : {2, 236, 255}) {
    const std::byte bytes[] = {static_cast<std::byte>(byte)};
    WireReader in(bytes);
    (void)in.Get<bool>();
    EXPECT_FALSE(in.ok()) << byte;
  }
}

TEST(WireTest, EveryTypeReadsBackAsWrittenOnRandomValues) {
  const uint64_t seed = testing::TestSeed();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (BACKPLANE_TEST_SEED replays it)");
  std::mt19937_64 random(seed);
  std::vector<std::byte> buffer(1 << 20);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::vector<float>> data;
    SubgraphDesc subgraph;
    for (int i = static_cast<int>(random() % 3); i >= 0; --i) {
      subgraph.layers.push_back(RandomOperator(random, data));
      subgraph.layer_inputs.push_back({"a", "b" + std::to_string(i)});
      subgraph.layer_outputs.push_back({"c"});
    }
    subgraph.inputs = {"x"};
    subgraph.input_infos = {TensorInfo{DataType::kFloat32, {2, 2}}};
    subgraph.outputs = {"y", "z"};
    subgraph.output_infos = {TensorInfo{DataType::kBool, {1}}, TensorInfo{DataType::kInt8, {}}};
    const BackendOptions options{{"b", true}, {"i", int64_t{-7}}, {"d", 0.25}, {"s", "text"}};
    const Status status(LoadReason::kUntrusted, "not on the list");

    WireWriter out(buffer);
    out.Put(subgraph);
    out.Put(options);
    out.Put(status);
    out.Put(Status::Ok());
    out.Put(std::vector<OptionDescriptor>{{"k", OptionType::kDouble, 1.5, "help"}});
    ASSERT_TRUE(out.ok());

    ConstantStore constants;
    WireReader in(std::span<const std::byte>(buffer).first(out.size()));
    const SubgraphDesc read = in.GetSubgraph(constants);
    ASSERT_EQ(read.layers.size(), subgraph.layers.size());
    for (std::size_t i = 0; i < read.layers.size(); ++i)
      ExpectSame(read.layers[i], subgraph.layers[i]);
    EXPECT_EQ(read.layer_inputs, subgraph.layer_inputs);
    EXPECT_EQ(read.output_infos, subgraph.output_infos);
    EXPECT_EQ(in.GetOptions(), options);
    const Status read_status = in.GetStatus();
    EXPECT_EQ(read_status.reason(), LoadReason::kUntrusted);
    EXPECT_EQ(read_status.message(), "not on the list");
    EXPECT_TRUE(in.GetStatus().ok());
    const auto descriptors = in.GetDescriptors();
    ASSERT_EQ(descriptors.size(), 1u);
    EXPECT_EQ(std::get<double>(descriptors[0].default_value), 1.5);
    EXPECT_TRUE(in.ok());
    EXPECT_EQ(in.remaining(), 0u);

    // Every prefix ends early and says so; corrupted bytes never read past the end.
    const std::size_t cut = random() % out.size();
    WireReader truncated(std::span<const std::byte>(buffer).first(cut));
    ConstantStore more;
    (void)truncated.GetSubgraph(more);
    (void)truncated.GetOptions();
    (void)truncated.GetStatus();
    (void)truncated.GetStatus();
    (void)truncated.GetDescriptors();
    EXPECT_FALSE(truncated.ok()) << "a message cut at " << cut << " of " << out.size();
    auto corrupted = std::vector<std::byte>(buffer.begin(), buffer.begin() + out.size());
    for (int flips = 0; flips < 8; ++flips)
      corrupted[random() % corrupted.size()] = static_cast<std::byte>(random());
    WireReader garbage(corrupted);
    (void)garbage.GetSubgraph(more);
    (void)garbage.GetOptions();
  }
}

TEST(WireTest, AWriterRefusesWhatDoesNotFit) {
  std::vector<std::byte> small(24);
  WireWriter out(small);
  out.PutString("twelve bytes");  // a length of 8 bytes, then 12
  EXPECT_TRUE(out.ok());
  EXPECT_EQ(out.size(), 20u);
  out.PutString("");  // the length alone no longer fits
  EXPECT_FALSE(out.ok());
  out.Put(uint8_t{1});
  EXPECT_FALSE(out.ok()) << "stays failed";
  EXPECT_EQ(out.size(), 20u);
}

}  // namespace
}  // namespace backplane::isolation
