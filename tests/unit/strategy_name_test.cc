// common/strategy_name.h: the one grammar of strategy names that the agent, the bench, the tuner, its
// exporters and the NCCL tuner plugin read. Every name it can form prints and parses back; what it refuses,
// it refuses with the valid forms. The strategies that run are tested in tests/strategies.

#include "gradscope/common/strategy_name.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "gradscope/common/recommendation.h"

namespace gradscope {
namespace {

// Every strategy the grammar can name, built from its parts rather than from text.
std::vector<StrategyName> everyName() {
  std::vector<StrategyName> names;
  std::vector<std::optional<WireFormat>> wires = {std::nullopt};
  for (WireFormat wire : kWireFormats) wires.emplace_back(wire);
  std::vector<StrategyName> transports;
  for (Transport transport : {Transport::Native, Transport::RsAg, Transport::ReduceBcast, Transport::Hier}) {
    StrategyName name;
    name.transport = transport;
    transports.push_back(name);
  }
  for (int id = 1; id <= kMpiAlgorithmCount; ++id) {
    StrategyName name;
    name.transport = Transport::Engine;
    name.engine = Backend::Mpi;
    name.algorithm = id;
    transports.push_back(name);
  }
  for (int algorithm = 0; algorithm < kNcclAlgoCount; ++algorithm)
    for (int protocol = 0; protocol < kNcclProtoCount; ++protocol) {
      StrategyName name;
      name.transport = Transport::Engine;
      name.engine = Backend::Nccl;
      name.algorithm = algorithm;
      name.protocol = protocol;
      transports.push_back(name);
    }
  for (const StrategyName& transport : transports) {
    for (const auto& wire : wires) {
      StrategyName sum = transport;
      sum.wire = wire;
      names.push_back(sum);
    }
    StrategyName adacons = transport;
    adacons.aggregator = Aggregator::AdaCons;
    names.push_back(adacons);
  }
  StrategyName adasum;
  adasum.aggregator = Aggregator::AdaSum;
  names.push_back(adasum);
  return names;
}

std::string upperCase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

TEST(StrategyNames, EveryNamePrintsAndParsesBack) {
  const std::vector<StrategyName> names = everyName();
  EXPECT_EQ(names.size(), (4u + 6u + 7u * 3u) * (1u + 4u + 1u) + 1u);
  for (const StrategyName& name : names) {
    // Printed in lower case, read back in any case, and classed by what it is.
    const std::string text = name.text();
    EXPECT_EQ(parseStrategyName(text), name) << text;
    EXPECT_EQ(parseStrategyName(upperCase(text)), name) << text;
    EXPECT_TRUE(std::none_of(text.begin(), text.end(), [](unsigned char c) { return std::isupper(c); }))
        << text;
    const ErrorClass expected = name.aggregator != Aggregator::Sum ? ErrorClass::Semantic
                                : name.wire                        ? ErrorClass::Lossy
                                                                   : ErrorClass::Lossless;
    EXPECT_EQ(strategyErrorClass(text), expected) << text;
  }
}

TEST(StrategyNames, WrittenFormsAndTheirCanonicalSpelling) {
  EXPECT_EQ(parseStrategyName("Sum/NCCL.Tree.LL128/BF16")->text(), "sum/nccl.tree.ll128/bf16");
  EXPECT_EQ(parseStrategyName("sum/rs_ag/native")->text(), "sum/rs_ag");
  EXPECT_EQ(parseStrategyName("adacons/hier/native")->text(), "adacons/hier");
  // NCCL's algorithms in NVIDIA's tuner spelling too, which the tuner plugin has always accepted.
  EXPECT_EQ(parseStrategyName("sum/nccl.collnet_direct.ll")->text(), "sum/nccl.collnetdirect.ll");
  EXPECT_EQ(parseStrategyName("sum/nccl.NVLS_TREE.simple")->text(), "sum/nccl.nvlstree.simple");
  EXPECT_EQ(parseStrategyName("sum/mpi.Recursive_Doubling")->text(), "sum/mpi.recursive_doubling");
}

TEST(StrategyNames, SplitKeepsThePartsAsWritten) {
  EXPECT_FALSE(splitStrategyName("sum"));
  const auto two = splitStrategyName("Sum/nccl.star.ll");
  ASSERT_TRUE(two);
  EXPECT_EQ(two->aggregator, "Sum");
  EXPECT_EQ(two->transport, "nccl.star.ll");
  EXPECT_FALSE(two->wire);
  const auto three = splitStrategyName("sum/native/fp16/x");
  ASSERT_TRUE(three);
  EXPECT_EQ(three->transport, "native");
  EXPECT_EQ(three->wire, "fp16/x");
  const auto empty_wire = splitStrategyName("sum/native/");
  ASSERT_TRUE(empty_wire);
  EXPECT_EQ(empty_wire->wire, "");
}

TEST(StrategyNames, UnknownNamesAreRefusedWithTheValidForms) {
  for (const char* text : {"", "sum", "mean/native", "sum/ring", "sum/native/fp4", "adasum/rs_ag",
                           "adacons/rs_ag/bf16", "adasum/native/bf16", "sum/mpi.fastest", "sum/mpi.",
                           "sum/nccl.ring", "sum/nccl.ring.ll256", "sum/nccl..simple", "sum/native/fp16/x"}) {
    std::string error;
    EXPECT_FALSE(parseStrategyName(text, &error)) << text;
    EXPECT_NE(error.find(fmt::format("'{}'", text)), std::string::npos) << error;
    EXPECT_NE(error.find("valid: sum/<transport>[/<wire>], adacons/<transport>, adasum/native"),
              std::string::npos)
        << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
}

TEST(StrategyNames, MoreRefusals) {
  for (const char* text :
       {"/native", "sum/", "sum//bf16", "sum/native/", "sum/mpi.ignore", "sum/mpi.0", "sum/nccl.ring.ll.x",
        "sum/nccl.star.ll", "sum/native/fp32", " sum/native", "sum/native ", "sum/rs-ag"}) {
    std::string error;
    EXPECT_FALSE(parseStrategyName(text, &error)) << text;
    EXPECT_NE(error.find(fmt::format("'{}'", text)), std::string::npos) << error;
  }
  // The valid forms are generated from the name tables, so they list every name there is.
  std::string error;
  parseStrategyName("x", &error);
  EXPECT_NE(error.find("nccl.<tree|ring|collnetdirect|collnetchain|nvls|nvlstree|pat>.<ll|ll128|simple>"),
            std::string::npos)
      << error;
  EXPECT_NE(
      error.find("mpi.<basic_linear|nonoverlapping|recursive_doubling|ring|segmented_ring|rabenseifner>"),
      std::string::npos)
      << error;
  EXPECT_NE(error.find("wire fp16, bf16, fp8e4m3 or fp8e5m2"), std::string::npos) << error;
}

TEST(StrategyNames, MpiAlgorithms) {
  const char* names[] = {"basic_linear", "nonoverlapping", "recursive_doubling",
                         "ring",         "segmented_ring", "rabenseifner"};
  for (int id = 1; id <= 6; ++id) {
    EXPECT_EQ(mpiAlgorithmName(id), names[id - 1]);
    EXPECT_EQ(parseMpiAlgorithm(names[id - 1]), id);
  }
  EXPECT_EQ(parseMpiAlgorithm("RING"), 4);
  EXPECT_TRUE(mpiAlgorithmName(0).empty());
  EXPECT_TRUE(mpiAlgorithmName(7).empty());
  EXPECT_FALSE(parseMpiAlgorithm("default"));
}

TEST(StrategyNames, MpiAlgorithmIdsAreOpenMpiValues) {
  // ompi_info --param coll tuned --level 9 (Open MPI 4.1): coll_tuned_allreduce_algorithm
  // 0:"ignore", 1:"basic_linear", ... 6:"rabenseifner". The exporters write the id as that variable.
  EXPECT_EQ(kMpiAlgorithmCount, 6);
  EXPECT_EQ(mpiAlgorithmName(kMpiAlgorithmCount), "rabenseifner");
  EXPECT_FALSE(parseMpiAlgorithm("ignore"));
  EXPECT_FALSE(parseMpiAlgorithm(""));
}

TEST(StrategyNames, AggregatorNames) {
  for (Aggregator aggregator :
       {Aggregator::Sum, Aggregator::AdaCons, Aggregator::AdaSum, Aggregator::Async}) {
    EXPECT_EQ(parseAggregator(name(aggregator)), aggregator);
    EXPECT_EQ(parseAggregator(upperCase(std::string(name(aggregator)))), aggregator);
  }
  EXPECT_FALSE(parseAggregator("mean"));
  EXPECT_FALSE(parseAggregator(""));
}

// async/stale<K> and async/dga<K> (docs/async.md): K from 1 to 4, no transport or wire of their own, and
// semantic like AdaCons (they change what the job computes).
TEST(StrategyNames, AsyncNames) {
  for (int k = 1; k <= kMaxStaleness; ++k)
    for (const char* delay : {"stale", "dga"}) {
      const std::string text = fmt::format("async/{}{}", delay, k);
      const auto name = parseStrategyName(upperCase(text));
      ASSERT_TRUE(name) << text;
      EXPECT_EQ(name->aggregator, Aggregator::Async);
      EXPECT_EQ(name->staleness, k);
      EXPECT_EQ(name->delay, delay[0] == 's' ? StrategyName::Delay::Stale : StrategyName::Delay::Dga);
      EXPECT_EQ(name->text(), text);
      EXPECT_EQ(strategyErrorClass(text), ErrorClass::Semantic);
    }
  for (const char* bad : {"async/stale0", "async/stale5", "async/dga", "async/native", "async/stale1/bf16",
                          "async/stale12", "async/rs_ag"}) {
    std::string error;
    EXPECT_FALSE(parseStrategyName(bad, &error)) << bad;
    EXPECT_NE(error.find("async/stale<K>"), std::string::npos) << error;
  }
}

TEST(NcclNames, BothSpellingsMeetInOneCode) {
  for (int algo = 0; algo < kNcclAlgoCount; ++algo) {
    EXPECT_EQ(parseNcclAlgo(ncclAlgoName(algo)), algo) << ncclAlgoName(algo);
    EXPECT_EQ(parseNcclAlgo(ncclTunerAlgoName(algo)), algo) << ncclTunerAlgoName(algo);
    EXPECT_EQ(parseNcclAlgo(upperCase(std::string(ncclTunerAlgoName(algo)))), algo);
  }
  for (int proto = 0; proto < kNcclProtoCount; ++proto) {
    EXPECT_EQ(parseNcclProto(ncclProtoName(proto)), proto) << ncclProtoName(proto);
    EXPECT_EQ(parseNcclProto(ncclTunerProtoName(proto)), proto) << ncclTunerProtoName(proto);
  }
  EXPECT_EQ(ncclTunerAlgoName(2), "collnet_direct");
  EXPECT_EQ(ncclTunerAlgoName(5), "nvls_tree");
  EXPECT_TRUE(ncclTunerAlgoName(kNcclAlgoCount).empty());
  EXPECT_TRUE(ncclTunerProtoName(-1).empty());
  EXPECT_FALSE(parseNcclAlgo("star"));
  EXPECT_FALSE(parseNcclAlgo(""));
  EXPECT_FALSE(parseNcclAlgo("_"));
  EXPECT_FALSE(parseNcclProto("ll256"));
}

TEST(WireFormatNames, AreTheDTypesNames) {
  for (WireFormat wire : kWireFormats) {
    EXPECT_EQ(parseWireFormat(name(wire)), wire);
    EXPECT_TRUE(parseDType(name(wire))) << name(wire);
  }
  EXPECT_FALSE(parseWireFormat("native"));
  EXPECT_FALSE(parseWireFormat("FP16"));  // exact: strategy names are lower-cased before the look-up
}

}  // namespace
}  // namespace gradscope
