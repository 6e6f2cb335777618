// The processes of expert parallelism and the messages between them, over MPI (Open MPI's C
// API). Launched by mpirun (or a cluster's srun) with more than one process, rank 0 runs the
// command and every other rank serves experts (pipeline/ranks/worker.h); otherwise, and in a
// build without MPI, there is one process of rank 0 and nothing here sends anything.
//
// Every wait polls with a deadline instead of blocking in MPI: a rank that died or hangs ends
// the wait with an error naming it and its host, and a waiting process sleeps between polls
// (MPI's blocking calls spin, which would take the cores from the ranks computing beside it).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace k3::ranks {

// Message tags. What the messages carry is pipeline/ranks/protocol.h's structs, encoded and
// decoded there; a job is kJob then kRows, answered by kProducts (or kError).
enum Tag : int {
  kHello = 1,  // rank 0 -> worker: int64 {0}: open the checkpoint (rank 0's model exists now)
  kInfo,       // worker -> rank 0: WorkerInfo (JSON): its capacity and identity, or its error
  kJob,        // rank 0 -> worker: a LayerJob's header (int64)
  kRows,       // rank 0 -> worker: the LayerJob's rows (float)
  kProducts,   // worker -> rank 0: the LayerResult (float): the products, then its seconds
  kError,      // worker -> rank 0: what failed (text); the worker then waits to be ended
  kShutdown,   // rank 0 -> worker: int64 {0}: exit (before or after kHello)
  kPing,       // rank 0 -> worker: floats, the first the count to answer with; and the answer
  kPrefetch,   // rank 0 -> worker: a LayerGuess (int64): the lookahead's guesses
};

struct World {
  int rank = 0;
  int size = 1;
  std::vector<std::string> hosts;  // hosts[r]: where rank r runs
};

// Starts MPI when this process was launched by mpirun or srun with more than one process, and
// learns every rank's host; call first in main. At rank 0's exit every worker is told to exit
// (Shutdown).
void Init(int* argc, char*** argv);
const World& world();
inline bool Distributed() { return world().size > 1; }
// "rank 2 on host-b"
std::string Name(int rank);

// The seconds a wait for another rank may take before the job fails: K3_RANK_TIMEOUT (seconds)
// or 120; `open` is the longer wait for a worker to open its checkpoint (10x that).
absl::Duration Timeout(bool open = false);

// Sends without waiting for the receiver: the data must stay valid until WaitSends.
absl::Status PostSend(int to, Tag tag, std::span<const int64_t> data);
absl::Status PostSend(int to, Tag tag, std::span<const float> data);
absl::Status PostSend(int to, Tag tag, std::string_view text);
// Waits for every posted send to complete (a completed send can be reused).
absl::Status WaitSends(absl::Duration timeout);

// A message matched by Await, still to be received into one of the Receive calls.
struct Incoming {
  int from = 0;
  Tag tag = kHello;
  int64_t bytes = 0;
  void* handle = nullptr;  // MPI_Message
};
// Waits for the next message from `from` carrying one of `tags`, within `timeout`
// (absl::InfiniteDuration for a worker waiting for work). A kError message from `from` ends the
// wait with its text, named for the rank and host; DeadlineExceeded names them too.
absl::StatusOr<Incoming> Await(int from, std::span<const Tag> tags, absl::Duration timeout);
absl::Status Receive(Incoming& m, std::vector<int64_t>& out);
absl::Status Receive(Incoming& m, std::vector<float>& out);
absl::Status Receive(Incoming& m, std::string& out);

// Ends every rank now (mpirun's exit code is `code`): what rank 0 does after a rank failed, as
// MPI_Finalize would wait for it forever.
[[noreturn]] void Abort(int code);
// Rank 0: tells every worker to exit, then MPI_Finalize (at exit, once).
void Shutdown();
// Rank 0: a rank failed or did not answer. Prints `status` (it names the rank and its host) and
// ends every rank: no token comes from a layer without all its experts, and a server does not
// stay up answering errors.
[[noreturn]] void FailJob(const absl::Status& status);

}  // namespace k3::ranks
