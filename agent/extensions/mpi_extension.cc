// libgradscope-agent-mpi.so: explore and apply over MPI communicators (extension.h says why this is
// a library of its own, and what the agent guarantees about the order of calls; strategy_extension.h
// holds everything that is not MPI's).
//
// MPI specifics: start() agrees over a copy of MPI_COMM_WORLD (every rank calls it right after
// MPI_Init); each job communicator's duplicate is a private copy of it (comm::mpiDuplicateOf); the shadow
// arena is one host mapping made at start, touched only as used; the job's buffers are host memory, and
// every MPI call is complete when it returns, so no ordering with the job's work is needed.
//
// Threads. Below MPI_THREAD_MULTIPLE the intercepted call's thread is the only one in MPI: the
// duplicates, the communicators of sum/hier and those of Open MPI's forced algorithms are made lazily,
// at a communicator's first explored or applied call. At MPI_THREAD_MULTIPLE some job thread may be
// creating a communicator at any moment once MPI_Init_thread has returned, and the agent must create
// none beside it: Open MPI 4.1 can deadlock when two threads create communicators at once (both ranks
// seen waiting in its CID agreement under explore), and a forced algorithm, a process-wide variable
// while a communicator is made, would reach the job's. So at that level every communicator the agent
// needs is made inside a creation the job is making anyway: at MPI_Init for MPI_COMM_WORLD and
// MPI_COMM_SELF (and Open MPI's forced algorithms, for MPI_COMM_WORLD only: comm/mpi.h,
// mpiPrepareForcedAlgorithms), and inside the job's MPI_Comm_dup, _split, ... for the others
// (prepare(), sealed copies: comm/mpi.h, mpiDuplicateOf).

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include <fmt/format.h>
#include <mpi.h>

#include "extensions/strategy_extension.h"
#include "gradscope/comm/mpi.h"
#include "gradscope/comm/strategy.h"
#include "gradscope/common/error.h"
#include "gradscope/common/launcher.h"

namespace gradscope::agent {
namespace {

// The link probe (ExploreSettings::probe_links): each host's lowest rank exchanges kLinkBytes both ways
// at once with the lowest rank of up to kLinkRounds other hosts, kLinkTries times each, keeping the
// fastest. At most 4 × 3 exchanges of 1 MiB per host, once, at start: about 1 s on a 100 Mbit/s link
// (84 ms an exchange), a few milliseconds on a cluster's network.
constexpr int kLinkBytes = 1 << 20;
constexpr int kLinkRounds = 4;
constexpr int kLinkTries = 3;
constexpr int kHostNameBytes = 256;
constexpr int kLinkTag = 0x6c6b;

// The partner of `slot` in round `round` of a round-robin tournament of `slots` (even) players: every
// round pairs every slot, and no two rounds pair the same two (the circle method: slot + partner =
// round modulo slots - 1, the slot that would pair with itself meeting the last one).
int tournamentPartner(int slot, int round, int slots) {
  const int m = slots - 1;
  if (slot == m) return static_cast<int>((static_cast<long>(round) * (m + 1) / 2) % m);
  const int partner = ((round - slot) % m + m) % m;
  return partner == slot ? m : partner;
}

// Times the links between the job's hosts, as the probe above says. Collective over MPI_COMM_WORLD,
// inside MPI_Init: every rank takes part in the splits and in the barrier at the end, so that no rank's
// job starts while its host's link is being timed. An odd number of hosts gives one a bye each round.
std::vector<LinkSample> probeLinks() {
  std::vector<LinkSample> samples;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm host = MPI_COMM_NULL, leaders = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &host);
  int host_rank = 0;
  MPI_Comm_rank(host, &host_rank);
  MPI_Comm_split(MPI_COMM_WORLD, host_rank == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
  if (leaders != MPI_COMM_NULL) {
    int hosts = 1, me = 0;
    MPI_Comm_size(leaders, &hosts);
    MPI_Comm_rank(leaders, &me);
    if (hosts > 1) {
      std::vector<char> name(kHostNameBytes, '\0');
      const std::string mine = hostName();
      std::copy_n(mine.begin(), std::min<std::size_t>(mine.size(), kHostNameBytes - 1), name.begin());
      std::vector<char> names(static_cast<std::size_t>(hosts) * kHostNameBytes);
      MPI_Allgather(name.data(), kHostNameBytes, MPI_CHAR, names.data(), kHostNameBytes, MPI_CHAR, leaders);
      std::vector<unsigned char> out(kLinkBytes, 0x5a), in(kLinkBytes);
      const int slots = hosts % 2 == 0 ? hosts : hosts + 1;
      for (int round = 0; round < std::min(slots - 1, kLinkRounds); ++round) {
        const int partner = tournamentPartner(me, round, slots);
        if (partner < hosts) {
          double best = std::numeric_limits<double>::max();
          for (int attempt = 0; attempt < kLinkTries; ++attempt) {
            const double begin = MPI_Wtime();
            MPI_Sendrecv(out.data(), kLinkBytes, MPI_BYTE, partner, kLinkTag, in.data(), kLinkBytes, MPI_BYTE,
                         partner, kLinkTag, leaders, MPI_STATUS_IGNORE);
            best = std::min(best, MPI_Wtime() - begin);
          }
          samples.push_back({mine, std::string(&names[static_cast<std::size_t>(partner) * kHostNameBytes]),
                             kLinkBytes, static_cast<std::int64_t>(best * 1e9)});
        }
        MPI_Barrier(leaders);  // rounds apart: no exchange shares a link with another round's
      }
    }
    MPI_Comm_free(&leaders);
  }
  MPI_Comm_free(&host);
  MPI_Barrier(MPI_COMM_WORLD);
  return samples;
}

class MpiExtension final : public StrategyExtension {
 public:
  using StrategyExtension::StrategyExtension;

  void stop() override {
    StrategyExtension::stop();
    comm::mpiReleaseForcedAlgorithms();
    world_.reset();  // MPI_Finalize is next
  }

  std::vector<LinkSample> links() const override { return links_; }

 protected:
  bool agreeToStart(const std::string& local_problem, std::string& error) override {
    world_ = comm::mpiWorld();  // MPI is initialised: a copy of MPI_COMM_WORLD
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    // One gather: this rank's problem, whether it runs MPI_THREAD_MULTIPLE, the Open MPI algorithms its
    // settings want forced (the same everywhere, unless the ranks were given different files).
    std::vector<double> mine = {local_problem.empty() ? 0.0 : 1.0, level == MPI_THREAD_MULTIPLE ? 1.0 : 0.0};
    const std::vector<int> wanted = wantedAlgorithms();
    for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm)
      mine.push_back(std::count(wanted.begin(), wanted.end(), algorithm) != 0 ? 1.0 : 0.0);
    const auto all = world_->allGatherValues(mine);
    const std::size_t stride = mine.size();
    const auto ranks = static_cast<std::size_t>(world_->size());
    // The lowest failing rank says why; the others stay quiet (a bad file would say it N times).
    for (std::size_t r = 0; r < ranks; ++r)
      if (all[r * stride] != 0) {
        error = r == static_cast<std::size_t>(world_->rank()) ? local_problem : std::string();
        return false;
      }
    bool multiple = false;
    std::vector<int> algorithms;
    for (std::size_t r = 0; r < ranks; ++r) multiple = multiple || all[r * stride + 1] != 0;
    for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm)
      for (std::size_t r = 0; r < ranks; ++r)
        if (all[r * stride + 1 + static_cast<std::size_t>(algorithm)] != 0) {
          algorithms.push_back(algorithm);
          break;
        }
    multiple_ = multiple;
    if (settings().probe_links) links_ = probeLinks();
    if (multiple && !algorithms.empty()) {
      try {
        comm::mpiPrepareForcedAlgorithms(*world_, algorithms);
        notePreparedEngines();
      } catch (const std::exception& failure) {
        if (speaksForAll())
          log(fmt::format(
              "Open MPI's algorithms cannot be forced ({}); the sum/mpi.* strategies are left out",
              failure.what()));
      }
    }
    return true;
  }

  bool speaksForAll() const override { return world_ && world_->rank() == 0; }

  bool reserve(std::size_t bytes) override { return arena_.mapHost(bytes); }

  // start() agreed over the world: every rank joins. At MPI_THREAD_MULTIPLE only inside the job's own
  // creation of the communicator (prepare()), and sealed: nothing creates a communicator later.
  std::unique_ptr<comm::Communicator> duplicate(const ShadowCall& call, bool, bool at_creation) override {
    if (multiple_ && !at_creation)
      fail("a communicator not prepared when the job created it, in a job at MPI_THREAD_MULTIPLE");
    // The async strategies' worker needs a copy of its own, made now where nothing may be made later.
    return comm::mpiDuplicateOf(call.comm, /*sealed=*/multiple_, /*concurrent=*/multiple_ && appliesAsync());
  }

  bool preparesAtCreation() const override { return multiple_; }

  bool take(const ShadowCall& call, std::size_t input_bytes, bool want_gather, Capture& capture) override {
    const std::size_t base = Capture::baseBytes(input_bytes, call.count);
    std::byte* slice =
        want_gather ? arena_.take(base + Capture::gatherBytes(call.count, call.comm_size)) : nullptr;
    const bool with_gather = slice != nullptr;
    if (slice == nullptr) slice = arena_.take(base);
    if (slice == nullptr) return false;
    capture = Capture::layout(slice, nullptr, input_bytes, call.count, with_gather);
    return true;
  }

  void give(Capture& capture) override {
    arena_.give(capture.slice);
    capture = {};
  }

  void copyInput(const ShadowCall&, void* dst, const void* src, std::size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }

 private:
  static constexpr int kAlgorithms = 6;  // Open MPI's coll/tuned all-reduce algorithms, 1 to 6

  // The Open MPI algorithms this rank's settings would force: explore's strategies (all of them when
  // none are named), or apply's rules.
  std::vector<int> wantedAlgorithms() const {
    const ExploreSettings& given = settings();
    const std::vector<std::string>& names = given.applying ? given.apply_strategies : given.strategies;
    std::vector<int> algorithms;
    if (!given.applying && names.empty()) {
      for (int algorithm = 1; algorithm <= kAlgorithms; ++algorithm) algorithms.push_back(algorithm);
      return algorithms;
    }
    for (const std::string& text : names)
      if (const auto name = parseStrategyName(text);
          name && name->transport == Transport::Engine && name->engine == Backend::Mpi)
        algorithms.push_back(name->algorithm);
    return algorithms;
  }

  SliceArena arena_;
  std::unique_ptr<comm::Communicator> world_;
  bool multiple_ = false;          // some rank runs MPI_THREAD_MULTIPLE (agreed at start)
  std::vector<LinkSample> links_;  // what the link probe timed here (a host's lowest rank only)
};

}  // namespace
}  // namespace gradscope::agent

extern "C" __attribute__((visibility("default"))) gradscope::agent::Extension* gradscope_agent_extension(
    int abi, const gradscope::agent::AgentHooks* hooks) {
  if (abi != gradscope::agent::kExtensionAbi) return nullptr;
  // Never destroyed: job threads may be inside it while the process exits, and its communicators
  // must not be freed after MPI_Finalize.
  return new gradscope::agent::MpiExtension(*hooks);
}
