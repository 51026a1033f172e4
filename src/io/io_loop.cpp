#include "io/io_loop.hpp"

#include <utility>

#include "util/thread_annotations.hpp"

namespace clairfs {

struct IoLoop::Mailbox {
  Mutex mutex;  // a leaf: nothing else is taken while it is held
  std::vector<std::pair<Done, int64_t>> answers GUARDED_BY(mutex);
};

IoLoop::IoLoop(unsigned depth) : ring_(depth), mailbox_(std::make_shared<Mailbox>()) {}

IoLoop::~IoLoop() {
  // The buffers of operations in flight belong to their callbacks, which go with this object.
  while (ring_.in_flight() > 0) (void)ring_.reap(true);
}

void IoLoop::open(int dir_fd, std::string path, Done done) {
  const uint64_t tag = next_tag_++;
  waiting_.emplace(tag, std::move(done));
  ring_.submit_open(dir_fd, std::move(path), tag);
}

void IoLoop::read(int fd, char* buf, size_t len, Done done, uint64_t offset) {
  const uint64_t tag = next_tag_++;
  waiting_.emplace(tag, std::move(done));
  ring_.submit(fd, buf, len, tag, offset);
}

void IoLoop::write(int fd, const char* buf, size_t len, Done done, uint64_t offset) {
  const uint64_t tag = next_tag_++;
  waiting_.emplace(tag, std::move(done));
  ring_.submit_write(fd, buf, len, tag, offset);
}

IoLoop::Done IoLoop::external(Done done) {
  ++external_in_flight_;
  std::weak_ptr<Mailbox> box = mailbox_;
  return [box, done = std::move(done)](int64_t result) {
    if (auto b = box.lock()) {
      MutexLock lock(b->mutex);
      b->answers.emplace_back(done, result);
    }
  };
}

size_t IoLoop::dispatch(const std::vector<Ring::Completion>& done) {
  size_t ran = 0;
  // Answers from other threads first: they were waited for longest.
  std::vector<std::pair<Done, int64_t>> answers;
  {
    MutexLock lock(mailbox_->mutex);
    answers.swap(mailbox_->answers);
  }
  for (auto& [callback, result] : answers) {
    --external_in_flight_;
    callback(result);
    ++ran;
  }
  for (const auto& c : done) {
    auto it = waiting_.find(c.tag);
    if (it == waiting_.end()) continue;
    Done callback = std::move(it->second);
    waiting_.erase(it);
    callback(c.result);
    ++ran;
  }
  return ran;
}

size_t IoLoop::run(std::chrono::milliseconds wait) {
  return dispatch(wait.count() > 0 ? ring_.reap_for(wait) : ring_.reap(false));
}

size_t IoLoop::run_waiting() { return dispatch(ring_.reap(true)); }

}  // namespace clairfs
