#include "pipeline/ranks/comm.h"

#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

#ifdef K3_WITH_MPI
#include <mpi.h>
#endif

namespace k3::ranks {
namespace {

World& MutableWorld() {
  static World w{.rank = 0, .size = 1, .hosts = {"localhost"}};
  return w;
}

}  // namespace

const World& world() { return MutableWorld(); }

std::string Name(int rank) {
  const World& w = world();
  return absl::StrCat("rank ", rank, " on ",
                      rank >= 0 && rank < static_cast<int>(w.hosts.size()) ? w.hosts[rank] : "?");
}

absl::Duration Timeout(bool open) {
  int seconds = 120;
  if (const char* v = std::getenv("K3_RANK_TIMEOUT"); v != nullptr) {
    if (!absl::SimpleAtoi(v, &seconds) || seconds <= 0) seconds = 120;
  }
  return absl::Seconds(open ? 10 * seconds : seconds);
}

void FailJob(const absl::Status& status) {
  std::fprintf(stderr, "k3: expert parallelism: %s; ending every rank\n",
               std::string(status.message()).c_str());
  Abort(1);
}

#ifdef K3_WITH_MPI

namespace {

bool finished = false;  // Shutdown ran

// The processes mpirun (or srun) started, from the environment their launcher sets; 1 when
// started otherwise.
int LaunchedSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    int n = 0;
    if (const char* v = std::getenv(name); v != nullptr && absl::SimpleAtoi(v, &n)) return n;
  }
  return 1;
}

void AtExit() {
  if (world().rank != 0 || finished) return;
  Shutdown();
}

std::vector<MPI_Request>& Sends() {
  static std::vector<MPI_Request> sends;
  return sends;
}

absl::Status Check(int rc, int peer, const char* what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return absl::UnavailableError(
      absl::StrCat(what, " with ", Name(peer), " failed: ", std::string(text, len)));
}

// Sleeps between polls: none for the first few, then growing to a quarter millisecond, so that a
// reply that comes quickly is seen at once and a long wait costs no core.
class Backoff {
 public:
  void Wait() {
    if (++polls_ < 64) return;
    std::this_thread::sleep_for(std::chrono::microseconds(pause_us_));
    pause_us_ = std::min(pause_us_ * 2, 250);
  }

 private:
  int polls_ = 0;
  int pause_us_ = 20;
};

template <typename T>
absl::Status Post(int to, Tag tag, const T* data, size_t count, MPI_Datatype type) {
  MPI_Request r;
  const int rc = MPI_Isend(data, static_cast<int>(count), type, to, tag, MPI_COMM_WORLD, &r);
  if (rc == MPI_SUCCESS) Sends().push_back(r);
  return Check(rc, to, "sending");
}

template <typename T>
absl::Status ReceiveAs(Incoming& m, std::vector<T>& out, MPI_Datatype type) {
  out.resize(static_cast<size_t>(m.bytes) / sizeof(T));
  auto* message = static_cast<MPI_Message*>(m.handle);
  const int rc =
      MPI_Mrecv(out.data(), static_cast<int>(out.size()), type, message, MPI_STATUS_IGNORE);
  delete message;
  m.handle = nullptr;
  return Check(rc, m.from, "receiving");
}

}  // namespace

void Init(int* argc, char*** argv) {
  if (LaunchedSize() <= 1) return;
  int provided = 0;
  // Serialized: the engine's steps call MPI one at a time, from whichever thread runs them.
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  World& w = MutableWorld();
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> all(static_cast<size_t>(w.size) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                MPI_CHAR, MPI_COMM_WORLD);
  w.hosts.clear();
  for (int r = 0; r < w.size; ++r) w.hosts.emplace_back(all.data() + r * MPI_MAX_PROCESSOR_NAME);
  // Statics made after std::atexit are destroyed before AtExit runs: make Shutdown's first.
  Sends().reserve(16);
  std::atexit(AtExit);
}

absl::Status PostSend(int to, Tag tag, std::span<const int64_t> data) {
  return Post(to, tag, data.data(), data.size(), MPI_INT64_T);
}
absl::Status PostSend(int to, Tag tag, std::span<const float> data) {
  return Post(to, tag, data.data(), data.size(), MPI_FLOAT);
}
absl::Status PostSend(int to, Tag tag, std::string_view text) {
  return Post(to, tag, text.data(), text.size(), MPI_CHAR);
}

absl::Status WaitSends(absl::Duration timeout) {
  std::vector<MPI_Request>& sends = Sends();
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff;
  for (;;) {
    int done = 0;
    std::vector<MPI_Status> statuses(sends.size());
    const int rc =
        MPI_Testall(static_cast<int>(sends.size()), sends.data(), &done, statuses.data());
    if (rc != MPI_SUCCESS) {
      for (const MPI_Status& s : statuses) {
        if (s.MPI_ERROR != MPI_SUCCESS) return Check(s.MPI_ERROR, s.MPI_SOURCE, "sending");
      }
      return Check(rc, -1, "sending");
    }
    if (done) break;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("a send did not complete within ", absl::FormatDuration(timeout)));
    }
    backoff.Wait();
  }
  sends.clear();
  return absl::OkStatus();
}

absl::StatusOr<Incoming> Await(int from, std::span<const Tag> tags, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff;
  for (;;) {
    int flag = 0;
    MPI_Message message;
    MPI_Status status;
    // A failure's text first, then what was asked for.
    int rc = MPI_Improbe(from, kError, MPI_COMM_WORLD, &flag, &message, &status);
    if (rc != MPI_SUCCESS) return Check(rc, from, "waiting");
    if (flag) {
      int len = 0;
      MPI_Get_count(&status, MPI_CHAR, &len);
      std::string text(static_cast<size_t>(len), '\0');
      MPI_Mrecv(text.data(), len, MPI_CHAR, &message, MPI_STATUS_IGNORE);
      return absl::InternalError(absl::StrCat(Name(from), " failed: ", text));
    }
    for (Tag tag : tags) {
      rc = MPI_Improbe(from, tag, MPI_COMM_WORLD, &flag, &message, &status);
      if (rc != MPI_SUCCESS) return Check(rc, from, "waiting");
      if (!flag) continue;
      int bytes = 0;
      MPI_Get_count(&status, MPI_BYTE, &bytes);
      return Incoming{.from = from, .tag = tag, .bytes = bytes, .handle = new MPI_Message(message)};
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(Name(from), " did not answer within ", absl::FormatDuration(timeout),
                       " (it died, hangs or cannot be reached; K3_RANK_TIMEOUT sets the seconds)"));
    }
    backoff.Wait();
  }
}

absl::Status Receive(Incoming& m, std::vector<int64_t>& out) {
  return ReceiveAs(m, out, MPI_INT64_T);
}
absl::Status Receive(Incoming& m, std::vector<float>& out) { return ReceiveAs(m, out, MPI_FLOAT); }
absl::Status Receive(Incoming& m, std::string& out) {
  std::vector<char> text;
  absl::Status s = ReceiveAs(m, text, MPI_CHAR);
  out.assign(text.begin(), text.end());
  return s;
}

void Abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

void Shutdown() {
  if (finished || world().size <= 1) return;
  finished = true;
  static const int64_t kBye[1] = {0};
  for (int r = 1; r < world().size; ++r) (void)PostSend(r, kShutdown, std::span(kBye));
  if (!WaitSends(Timeout()).ok()) Abort(1);
  MPI_Finalize();
}

#else  // without MPI: one process, nothing to send

void Init(int*, char***) {
  // Launched by mpirun all the same: each process would run the whole command alone.
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n != nullptr && std::string(n) != "1") {
    std::fprintf(stderr,
                 "k3: built without MPI: each of the %s processes mpirun started runs alone "
                 "(scripts/setup-deps.sh test installs Open MPI; then rebuild)\n",
                 n);
  }
}
absl::Status PostSend(int, Tag, std::span<const int64_t>) {
  return absl::UnimplementedError("MPI");
}
absl::Status PostSend(int, Tag, std::span<const float>) { return absl::UnimplementedError("MPI"); }
absl::Status PostSend(int, Tag, std::string_view) { return absl::UnimplementedError("MPI"); }
absl::Status WaitSends(absl::Duration) { return absl::OkStatus(); }
absl::StatusOr<Incoming> Await(int, std::span<const Tag>, absl::Duration) {
  return absl::UnimplementedError("k3 was built without MPI");
}
absl::Status Receive(Incoming&, std::vector<int64_t>&) { return absl::UnimplementedError("MPI"); }
absl::Status Receive(Incoming&, std::vector<float>&) { return absl::UnimplementedError("MPI"); }
absl::Status Receive(Incoming&, std::string&) { return absl::UnimplementedError("MPI"); }
void Abort(int code) { std::_Exit(code); }
void Shutdown() {}

#endif

}  // namespace k3::ranks
