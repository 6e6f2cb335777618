// The io_uring backend: one thread owns the ring. It takes chunks from the scheduler, submits
// them, waits for completions and hands each back. Other threads never touch the ring's queues;
// they wake the loop through an eventfd that the ring itself polls, so a single
// io_uring_submit_and_wait() sleeps on both "a read finished" and "new work arrived".
#include <liburing.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "io/engine_internal.h"

namespace k3::io::internal {
namespace {

constexpr uint64_t kWakeTag = 0;  // user_data of the eventfd poll; chunks are never null

unsigned RingEntries(size_t capacity) {
  unsigned n = 1;
  while (n < capacity + 1) n <<= 1;  // one slot more for the eventfd poll
  return n;
}

class UringBackend : public Backend {
 public:
  UringBackend() = default;
  ~UringBackend() override {
    Join();
    if (ring_ready_) io_uring_queue_exit(&ring_);
    if (event_fd_ >= 0) ::close(event_fd_);
  }

  absl::Status Init(const UringSetup& setup);

  std::string_view name() const override { return "io_uring"; }
  size_t capacity() const override { return capacity_; }
  void Start(ChunkSource* source) override {
    source_ = source;
    thread_ = std::thread([this] { Loop(); });
    loop_id_.store(thread_.get_id());
  }
  void Wake() override {
    // The loop re-reads the scheduler after every completion, so it never needs to wake itself.
    if (std::this_thread::get_id() == loop_id_.load()) return;
    const uint64_t one = 1;
    ssize_t n = ::write(event_fd_, &one, sizeof(one));
    (void)n;  // EAGAIN means the counter is already non-zero: the loop will wake anyway
  }
  void Join() override {
    if (thread_.joinable()) thread_.join();
  }
  int RegisterFile(int fd) override;
  void UpdateFile(int slot, int fd) override {
    io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1);
  }
  bool buffers_registered() const override { return buffers_registered_; }

 private:
  void Loop();
  io_uring_sqe* NextSqe();
  void ArmWake();
  void Prepare(Chunk* c);
  void Reap();

  io_uring ring_{};
  bool ring_ready_ = false;
  int event_fd_ = -1;
  size_t capacity_ = 0;
  bool buffers_registered_ = false;
  bool files_registered_ = false;
  int max_files_ = 0;
  int next_slot_ = 0;  // guarded by the engine's lock (RegisterFile is called under it)
  ChunkSource* source_ = nullptr;
  std::thread thread_;
  std::atomic<std::thread::id> loop_id_;
  size_t in_flight_ = 0;  // loop thread only
  std::vector<std::pair<Chunk*, int>> reaped_;
};

absl::Status UringBackend::Init(const UringSetup& setup) {
  capacity_ = setup.capacity;
  max_files_ = setup.max_files;
  int ret = io_uring_queue_init(RingEntries(capacity_), &ring_, 0);
  if (ret < 0) return absl::ErrnoToStatus(-ret, "io_uring_queue_init");
  ring_ready_ = true;
  event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (event_fd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  // Fixed files save a file-table lookup and reference count per read; optional.
  files_registered_ =
      io_uring_register_files_sparse(&ring_, static_cast<unsigned>(max_files_)) == 0;
  if (!setup.buffers.empty()) {
    ret = io_uring_register_buffers(&ring_, setup.buffers.data(),
                                    static_cast<unsigned>(setup.buffers.size()));
    buffers_registered_ = ret == 0;
    if (ret < 0 && setup.notices) {
      uint64_t bytes = 0;
      for (const iovec& v : setup.buffers) bytes += v.iov_len;
      NoticeOnce(
          "register-buffers",
          absl::StrCat("cannot register ", bytes >> 20, " MiB of read buffers with io_uring (",
                       std::strerror(-ret), "; raise 'ulimit -l'); reading without fixed buffers"));
    }
  }
  return absl::OkStatus();
}

int UringBackend::RegisterFile(int fd) {
  if (!files_registered_ || next_slot_ >= max_files_) return -1;
  const int slot = next_slot_;
  if (io_uring_register_files_update(&ring_, static_cast<unsigned>(slot), &fd, 1) != 1) return -1;
  ++next_slot_;
  return slot;
}

// The ring has a slot for every chunk in flight plus the poll, and everything prepared is
// submitted before the next batch, so this loops only if an earlier submit failed (EAGAIN).
io_uring_sqe* UringBackend::NextSqe() {
  io_uring_sqe* sqe;
  while ((sqe = io_uring_get_sqe(&ring_)) == nullptr) io_uring_submit(&ring_);
  return sqe;
}

void UringBackend::ArmWake() {
  io_uring_sqe* sqe = NextSqe();
  io_uring_prep_poll_add(sqe, event_fd_, POLLIN);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void UringBackend::Prepare(Chunk* c) {
  io_uring_sqe* sqe = NextSqe();
  const int fd = c->file_slot >= 0 ? c->file_slot : c->fd;
  if (c->buf_index >= 0) {
    io_uring_prep_read_fixed(sqe, fd, c->dest, c->length, c->file_offset, c->buf_index);
  } else {
    io_uring_prep_read(sqe, fd, c->dest, c->length, c->file_offset);
  }
  if (c->file_slot >= 0) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data64(sqe, reinterpret_cast<uintptr_t>(c));
}

void UringBackend::Reap() {
  reaped_.clear();
  bool woken = false;
  unsigned head;
  unsigned seen = 0;
  io_uring_cqe* cqe;
  io_uring_for_each_cqe(&ring_, head, cqe) {
    ++seen;
    if (cqe->user_data == kWakeTag) {
      woken = true;
    } else {
      reaped_.emplace_back(reinterpret_cast<Chunk*>(cqe->user_data), cqe->res);
    }
  }
  io_uring_cq_advance(&ring_, seen);
  if (woken) {
    uint64_t count;
    ssize_t n = ::read(event_fd_, &count, sizeof(count));  // reset before re-arming
    (void)n;
    ArmWake();
  }
  for (auto& [chunk, res] : reaped_) {
    --in_flight_;
    source_->Complete(chunk, res);
  }
}

void UringBackend::Loop() {
  ArmWake();
  std::vector<Chunk*> batch;
  for (;;) {
    batch.clear();
    const bool running = source_->TakeChunks(capacity_ - in_flight_, &batch);
    for (Chunk* c : batch) Prepare(c);
    in_flight_ += batch.size();
    if (!running && in_flight_ == 0) return;
    // EINTR (a signal), EAGAIN/EBUSY (kernel short of resources, or completions to reap first):
    // reaping and trying again is the remedy for each.
    const int ret = io_uring_submit_and_wait(&ring_, 1);
    const size_t before = in_flight_;
    Reap();
    if ((ret == -EAGAIN || ret == -EBUSY) && in_flight_ == before) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));  // don't spin on a full kernel
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateUringBackend(const UringSetup& setup) {
  auto backend = std::make_unique<UringBackend>();
  absl::Status s = backend->Init(setup);
  if (!s.ok()) return s;
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace k3::io::internal
