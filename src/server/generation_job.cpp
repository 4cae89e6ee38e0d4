#include "server/generation_job.h"

#include <spdlog/spdlog.h>
#include <boost/asio/post.hpp>

#include "server/api_error.h"

namespace ossrt::server {

GenerationJob::GenerationJob(ServerContext& ctx, std::shared_ptr<Exchange> exchange, std::string id)
    : ctx_(ctx),
      exchange_(std::move(exchange)),
      id_(std::move(id)),
      created_unix_(
          std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
              .count()),
      arrival_(Clock::now()),
      strand_(boost::asio::make_strand(ctx.io)) {}

GenerationJob::~GenerationJob() {
  if (counted_active_) ctx_.active_generations.fetch_sub(1);
}

void GenerationJob::start(std::vector<GenerationRequest> requests, bool streaming) {
  const size_t n = requests.size();
  last_token_time_.assign(n, Clock::time_point{});
  finished_.assign(n, false);
  for (size_t i = 0; i < n; ++i) {
    requests[i].id = n == 1 ? id_ : fmt::format("{}-{}", id_, i);
    requests[i].arrival = arrival_;
    request_ids_.push_back(requests[i].id);
  }
  const MetricLabels model = {{"model_name", ctx_.config.served_model_name}};
  ctx_.metrics.observe("vllm:request_params_n", model, double(n));
  if (n) ctx_.metrics.observe("vllm:request_params_max_tokens", model, requests[0].sampling.max_tokens);

  counted_active_ = true;
  ctx_.active_generations.fetch_add(1);
  std::weak_ptr<GenerationJob> weak = shared_from_this();
  // Registered before submitting: a disconnect that races the submit still cancels.
  exchange_->on_disconnect([weak] {
    if (auto self = weak.lock()) self->cancel_all();
  });
  for (size_t i = 0; i < n; ++i) {
    auto self = shared_from_this();
    bool accepted = ctx_.generator().submit(std::move(requests[i]), [self, i](const GenerationEvent& ev) {
      // Generator thread: copy and hop to the strand; never block here.
      boost::asio::post(self->strand_, [self, i, ev] { self->deliver(i, ev); });
    });
    if (!accepted) {
      for (size_t j = 0; j < i; ++j) ctx_.generator().cancel(request_ids_[j]);
      ctx_.metrics.add("vllm:admission_rejections", model);
      if (ctx_.draining.load()) throw overloaded(503, "The server is shutting down.", ctx_.config.retry_after_s);
      throw overloaded(429, "The server is overloaded: the request queue is full. Retry later.",
                       ctx_.config.retry_after_s);
    }
  }
  if (streaming && ctx_.config.sse_ping_interval_ms > 0) {
    // Created on the strand: deliver() (also on the strand) may already be running.
    boost::asio::post(strand_, [self = shared_from_this()] {
      if (self->produced_output_) return;
      self->ping_timer_ = std::make_unique<boost::asio::steady_timer>(self->strand_);
      self->arm_ping_timer();
    });
  }
}

// One timer per streaming request, armed only while it has produced nothing: a single pending
// wait on the io_context, no thread. The handler holds a weak pointer so a finished job dies.
void GenerationJob::arm_ping_timer() {
  if (produced_output_ || !ping_timer_) return;
  ping_timer_->expires_after(std::chrono::milliseconds(ctx_.config.sse_ping_interval_ms));
  std::weak_ptr<GenerationJob> weak = shared_from_this();
  ping_timer_->async_wait([weak](const boost::system::error_code& ec) {
    auto self = weak.lock();
    if (ec || !self || self->produced_output_ || self->client_gone()) return;
    if (!self->started_) {
      // Accepted by the generator (start() returned), so the SSE header may go out now.
      self->started_ = true;
      self->on_started();
    }
    self->exchange_->stream_write(": ping\n\n");
    self->arm_ping_timer();
  });
}

void GenerationJob::cancel_all() {
  boost::asio::post(strand_, [self = shared_from_this()] {
    for (size_t i = 0; i < self->request_ids_.size(); ++i)
      if (!self->finished_[i]) self->ctx_.generator().cancel(self->request_ids_[i]);
  });
}

void GenerationJob::deliver(size_t choice, const GenerationEvent& event) {
  if (choice >= finished_.size() || finished_[choice]) return;
  record_metrics(choice, event);
  if (!produced_output_ && (!event.token_ids.empty() || event.finished)) {
    produced_output_ = true;
    if (ping_timer_) ping_timer_->cancel();
  }
  try {
    // Lazily, on the strand: events of an accepted request may arrive before start() returns,
    // and nothing may be written before we know the generator accepted every choice.
    if (!started_) {
      started_ = true;
      on_started();
    }
    on_event(choice, event);
  } catch (const std::exception& e) {
    // Formatting must never take the process down; the stream ends with what was sent.
    spdlog::error("[{}] output formatting failed: {}", exchange_->request_id(), e.what());
  }
  if (!event.finished) return;
  finished_[choice] = true;
  if (++finished_count_ == finished_.size()) on_all_finished();
}

void GenerationJob::record_metrics(size_t choice, const GenerationEvent& event) {
  auto& m = ctx_.metrics;
  const MetricLabels model = {{"model_name", ctx_.config.served_model_name}};
  auto now = Clock::now();
  if (!event.token_ids.empty()) {
    auto& last = last_token_time_[choice];
    if (last == Clock::time_point{}) {
      // TTFT from the request's arrival at the HTTP layer, tokenization included (vLLM's definition).
      m.observe("vllm:time_to_first_token_seconds", model, std::chrono::duration<double>(now - arrival_).count());
    } else {
      double gap = std::chrono::duration<double>(now - last).count();
      m.observe("vllm:inter_token_latency_seconds", model, gap);
      m.observe("vllm:time_per_output_token_seconds", model, gap);
    }
    last = now;
  }
  if (!event.finished) return;
  m.add("vllm:prompt_tokens_total", model, event.prompt_tokens);
  m.add("vllm:generation_tokens_total", model, event.completion_tokens);
  m.add("vllm:request_success_total",
        {{"model_name", ctx_.config.served_model_name}, {"finished_reason", finish_reason_name(event.finish_reason)}});
  m.observe("vllm:e2e_request_latency_seconds", model, std::chrono::duration<double>(now - arrival_).count());
  m.observe("vllm:request_queue_time_seconds", model, event.queue_time);
  m.observe("vllm:request_prompt_tokens", model, event.prompt_tokens);
  m.observe("vllm:request_generation_tokens", model, event.completion_tokens);
  if (event.time_to_first_token > 0) {
    double prefill = std::max(0.0, event.time_to_first_token - event.queue_time);
    double decode = std::max(0.0, event.e2e_latency - event.time_to_first_token);
    m.observe("vllm:request_prefill_time_seconds", model, prefill);
    m.observe("vllm:request_decode_time_seconds", model, decode);
    m.observe("vllm:request_inference_time_seconds", model, prefill + decode);
  }
}

}  // namespace ossrt::server
