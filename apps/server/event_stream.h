// Server-sent events, written one way for every stream of the server: OpenAI's chunks,
// Anthropic's message events and GET /k3/events. The framing, the keep-alives and the end are
// here; what each event says is the route's.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace httplib {
class DataSink;
class Request;
class Response;
}  // namespace httplib

namespace k3::server {

// One event as the stream carries it: "event: NAME\n" (none when `name` is empty), then
// "data: DATA\n\n".
std::string FrameEvent(std::string_view name, std::string_view data);

// The writing end of one stream. A write that fails means the client has gone: that one and
// every later one return false.
class EventStream {
 public:
  explicit EventStream(httplib::DataSink& sink) : sink_(sink) {}

  bool Event(std::string_view name, std::string_view data) { return Write(FrameEvent(name, data)); }
  bool Data(std::string_view data) { return Write(FrameEvent("", data)); }
  // Events framed already (FrameEvent's text, one or several).
  bool Write(std::string_view framed);
  // A comment line, which clients ignore: a keep-alive that proxies see as traffic, and a
  // write that fails when the client has gone.
  bool Comment(std::string_view text);
  bool ok() const { return ok_; }

 private:
  httplib::DataSink& sink_;
  bool ok_ = true;
};

// Answers `req` with an event stream that `write` writes from one HTTP thread, to its end:
// true when the stream ended as it should (the stream is closed), false when the client went
// away (the connection is dropped). `released(success)` when httplib is done with the stream.
// text/event-stream; charset=utf-8, never cached, never compressed.
void SendEventStream(const httplib::Request& req, httplib::Response& res,
                     std::function<bool(EventStream&)> write,
                     std::function<void(bool)> released = nullptr);

}  // namespace k3::server
