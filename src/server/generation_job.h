#pragma once
// The life of one API request that generates: submits one GenerationRequest per choice, receives
// the generator's events on a strand of the io_context (never on the engine thread: parsing and
// JSON stay at the edge), records the vLLM latency metrics, and cancels generation when the client
// disconnects. Subclasses (chat, completions, responses) turn events into their API's JSON/SSE.
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/http_server.h"
#include "server/server_context.h"

namespace ossrt::server {

class GenerationJob : public std::enable_shared_from_this<GenerationJob> {
 public:
  using Clock = std::chrono::steady_clock;
  GenerationJob(ServerContext& ctx, std::shared_ptr<Exchange> exchange, std::string id);
  virtual ~GenerationJob();

  // Submits every request (one per choice). When the generator refuses (queue full or draining),
  // cancels what was submitted and throws ApiError 429/503 with Retry-After.
  // `streaming`: the answer is SSE, so keep it alive with `: ping` comments until output starts.
  void start(std::vector<GenerationRequest> requests, bool streaming = false);
  const std::string& id() const { return id_; }

 protected:
  // On the job's strand: once before the first event (e.g. send the SSE header), then every
  // event in order per choice. `event` is the generator's, unchanged.
  virtual void on_started() {}
  virtual void on_event(size_t choice, const GenerationEvent& event) = 0;
  virtual void on_all_finished() = 0;

  bool client_gone() const { return exchange_->client_gone(); }
  ServerContext& ctx_;
  std::shared_ptr<Exchange> exchange_;
  std::string id_;
  int64_t created_unix_;
  Clock::time_point arrival_;

 private:
  void deliver(size_t choice, const GenerationEvent& event);
  void record_metrics(size_t choice, const GenerationEvent& event);
  void cancel_all();
  void arm_ping_timer();

  boost::asio::strand<boost::asio::io_context::executor_type> strand_;
  std::vector<std::string> request_ids_;
  std::vector<Clock::time_point> last_token_time_;
  std::vector<bool> finished_;
  size_t finished_count_ = 0;
  bool counted_active_ = false;
  bool started_ = false;
  bool produced_output_ = false;  // any token or a finish: pings stop for good
  std::unique_ptr<boost::asio::steady_timer> ping_timer_;
};

}  // namespace ossrt::server
