#include "apps/server/event_stream.h"

#include <utility>

#include "httplib.h"

namespace k3::server {

std::string FrameEvent(std::string_view name, std::string_view data) {
  std::string out;
  if (!name.empty()) out.append("event: ").append(name).append("\n");
  out.append("data: ").append(data).append("\n\n");
  return out;
}

bool EventStream::Write(std::string_view framed) {
  ok_ = ok_ && sink_.write(framed.data(), framed.size());
  return ok_;
}

bool EventStream::Comment(std::string_view text) {
  return Write(std::string(": ").append(text).append("\n\n"));
}

void SendEventStream(const httplib::Request& req, httplib::Response& res,
                     std::function<bool(EventStream&)> write, std::function<void(bool)> released) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  // httplib compresses every text/ type but exactly "text/event-stream" for a client that
  // accepts an encoding (every browser), and its compressors hold the events back until the
  // stream ends. The charset must stay (a client that trusts the header would decode UTF-8 as
  // Latin-1), so the stream is answered as to a client that accepts none. `req` is httplib's
  // own, not const: it only hands it to us so.
  const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
  res.set_chunked_content_provider(
      "text/event-stream; charset=utf-8",
      [write = std::move(write)](size_t, httplib::DataSink& sink) {
        EventStream out(sink);
        if (!write(out)) return false;
        sink.done();
        return true;
      },
      std::move(released));
}

}  // namespace k3::server
