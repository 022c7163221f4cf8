#include "server/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "server/generate_call.h"
#include "server/openai_api.h"

namespace iris::server {
namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

constexpr uint32_t kHeaderLimit = 16 * 1024;      // request line + headers
constexpr size_t kPipelinedLimit = 64 * 1024;     // bytes read ahead while a reply streams

std::chrono::steady_clock::duration ToChrono(absl::Duration d) { return absl::ToChronoNanoseconds(d); }

// What every connection of one listener shares.
struct Shared {
  IrisService* service = nullptr;
  ServerOptions options;
  HttpServer::Mode mode = HttpServer::Mode::kApi;
  int64_t started = 0;  // unix seconds: the model's "created" in /v1/models
};

// One connection: reads requests (keep-alive), answers the simple endpoints at once, and for a
// generation is the GenerateCall's reactor (CallReactorOps): its calls come from any thread and
// are posted to the connection's strand. While a generation runs, a read stays pending so that a
// client that goes away cancels it (and its KV blocks are freed).
template <class Stream>
class Session : public std::enable_shared_from_this<Session<Stream>>, public CallReactorOps {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  template <class... Args>
  explicit Session(const Shared* shared, Args&&... args) : shared_(shared), stream_(std::forward<Args>(args)...) {}

  void Run() {
    net::dispatch(stream_.get_executor(), [self = this->shared_from_this()] { self->Begin(); });
  }

  // CallReactorOps, from any thread.
  void StartWrite(const v1::GenerateResponse* response) override {
    net::post(stream_.get_executor(),
              [self = this->shared_from_this(), r = *response]() mutable { self->WriteStreamMessage(std::move(r)); });
  }
  void FinishStream(const grpc::Status& status) override {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), status] { self->OnFinishStream(status); });
  }
  void FinishUnary(v1::GenerateReply reply, const grpc::Status& status) override {
    net::post(stream_.get_executor(), [self = this->shared_from_this(), reply = std::move(reply), status]() mutable {
      self->OnFinishUnary(std::move(reply), status);
    });
  }

 private:
  auto& tcp() { return beast::get_lowest_layer(stream_); }
  IrisService& service() { return *shared_->service; }
  const ServerOptions& options() const { return shared_->options; }

  void Begin() {
    if constexpr (kTls) {
      tcp().expires_after(ToChrono(options().http_read_timeout));
      stream_.async_handshake(net::ssl::stream_base::server, [self = this->shared_from_this()](beast::error_code ec) {
        if (ec) return self->Close();
        self->DoRead();
      });
    } else {
      DoRead();
    }
  }

  void DoRead() {
    request_id_.clear();
    parser_.emplace();
    parser_->body_limit(static_cast<uint64_t>(options().limits.max_message_bytes));
    parser_->header_limit(kHeaderLimit);
    tcp().expires_after(ToChrono(requests_ == 0 ? options().http_read_timeout : options().http_idle_timeout));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    ++requests_;
    tcp().expires_after(ToChrono(options().http_read_timeout));
    auto body = [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); };
    const auto expect = parser_->get().find(http::field::expect);
    if (expect != parser_->get().end() && beast::iequals(expect->value(), "100-continue") && !parser_->is_done()) {
      write_buf_ = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(write_buf_),
                       [self = this->shared_from_this(), body](beast::error_code ec, size_t) {
                         if (ec) return self->Close();
                         http::async_read(self->stream_, self->buffer_, *self->parser_, body);
                       });
      return;
    }
    http::async_read(stream_, buffer_, *parser_, body);
  }

  void OnReadError(beast::error_code ec) {
    keep_alive_ = false;
    if (ec == http::error::body_limit) {
      return SendError(413, absl::StrCat("body: over the limit of ", options().limits.max_message_bytes,
                                         " bytes (max_message_bytes)"));
    }
    if (ec == http::error::header_limit) {
      return SendError(431, absl::StrCat("headers: over the limit of ", kHeaderLimit, " bytes"));
    }
    if (ec == beast::error::timeout || ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted || requests_ == 0 ||
        !parser_->is_header_done()) {
      return Close();
    }
    return SendError(400, absl::StrCat("request: malformed HTTP (", ec.message(), ")"));
  }

  void OnRead(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    tcp().expires_never();
    request_ = parser_->release();
    keep_alive_ = request_.keep_alive();
    Route();
  }

  std::optional<std::string_view> Authorization() const {
    const auto it = request_.find(http::field::authorization);
    if (it == request_.end()) return std::nullopt;
    return std::string_view(it->value().data(), it->value().size());
  }

  void Route() {
    std::string_view target(request_.target().data(), request_.target().size());
    if (const size_t q = target.find('?'); q != std::string_view::npos) target = target.substr(0, q);
    const http::verb method = request_.method();
    auto only = [&](http::verb allowed) {
      if (method == allowed) return true;
      SendError(405, absl::StrCat("method: ", std::string(request_.method_string()), " is not allowed on ",
                                  std::string(target), " (", std::string(http::to_string(allowed)), ")"));
      return false;
    };
    if (target == "/health") {
      if (!only(http::verb::get)) return;
      if (service().draining()) return SendResponse(503, "application/json", R"({"status":"draining"})");
      return SendResponse(200, "application/json", R"({"status":"ok"})");
    }
    if (target == "/metrics") {
      if (!only(http::verb::get)) return;
      return SendResponse(200, "text/plain; version=0.0.4; charset=utf-8",
                          service().metrics().Render(service().scrape_state()));
    }
    if (shared_->mode == HttpServer::Mode::kApi) {
      if (target == "/v1/models") {
        if (!only(http::verb::get)) return;
        grpc::Status admitted = service().Admit(Authorization());
        if (!admitted.ok() && admitted.error_code() != grpc::StatusCode::UNAVAILABLE) return SendStatus(admitted);
        return SendResponse(200, "application/json",
                            openai::ModelsBody(service().model_info().model(), shared_->started, service().max_model_len()));
      }
      if (target == "/v1/chat/completions") {
        if (!only(http::verb::post)) return;
        return Generate(openai::Endpoint::kChatCompletions);
      }
      if (target == "/v1/completions") {
        if (!only(http::verb::post)) return;
        return Generate(openai::Endpoint::kCompletions);
      }
    }
    SendError(404, absl::StrCat("path: no route for ", std::string(target.substr(0, 128))));
  }

  void Generate(openai::Endpoint endpoint) {
    // 401 and 503 before the body is looked at.
    if (grpc::Status admitted = service().Admit(Authorization()); !admitted.ok()) return SendStatus(admitted);
    absl::StatusOr<openai::ParsedRequest> parsed =
        openai::ParseRequest(endpoint, request_.body(), service().model_info().model(), options().limits);
    request_.body().clear();
    request_.body().shrink_to_fit();
    if (!parsed.ok()) {
      service().metrics().RequestEnded(absl::StatusCodeToString(parsed.status().code()), "", {}, {}, 0, 0);
      return SendStatus(ToGrpcStatus(parsed.status()));
    }
    if (const auto id = request_.find("x-request-id"); id != request_.end()) {
      parsed->request.set_request_id(std::string(id->value()));
    }
    endpoint_ = endpoint;
    streaming_ = parsed->stream;
    include_usage_ = parsed->include_usage;
    first_chunk_ = true;
    headers_sent_ = false;
    peer_gone_ = false;
    usage_.Clear();
    self_ref_ = this->shared_from_this();  // the call holds a raw pointer to this reactor
    service().ReactorStarted();
    std::shared_ptr<GenerateCall> call;
    grpc::Status st = service().StartCall(Authorization(), parsed->request, streaming_, this, &call);
    if (!st.ok()) {
      self_ref_.reset();
      service().ReactorDone();
      return SendStatus(st);
    }
    call_ = std::move(call);
    service().HttpCallStarted();
    request_id_ = call_->request_id();
    who_ = openai::MakeIdentity(endpoint, request_id_, service().model_info().model());
    if constexpr (kTls) keep_alive_ = false;  // the watch read is not cancelled on TLS: one call per connection
    StartWatch();
  }

  // A read that only notices the client going away (or reads ahead a pipelined request).
  void StartWatch() {
    if (watching_ || peer_gone_ || buffer_.size() > kPipelinedLimit) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(4096), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
      self->OnWatch(ec, n);
    });
  }

  void OnWatch(beast::error_code ec, size_t n) {
    watching_ = false;
    if (resume_read_) {  // cancelled by AfterCall: the connection goes on
      resume_read_ = false;
      if (!ec) buffer_.commit(n);
      if (ec && ec != net::error::operation_aborted) return Close();
      return DoRead();
    }
    if (!ec) {
      buffer_.commit(n);
      if (call_) StartWatch();
      return;
    }
    peer_gone_ = true;
    keep_alive_ = false;
    if (call_) call_->ClientCancelled();
  }

  void WriteStreamMessage(v1::GenerateResponse r) {
    std::string events;
    const bool chat = endpoint_ == openai::Endpoint::kChatCompletions;
    if (first_chunk_ && chat) events += openai::ChunkEvent(who_, "", /*first=*/true, nullptr);
    first_chunk_ = false;
    if (!r.text().empty()) events += openai::ChunkEvent(who_, r.text(), false, nullptr);
    if (r.has_final()) {
      events += openai::ChunkEvent(who_, "", false, openai::FinishReasonText(r.final().finish_reason()));
      usage_ = r.final().usage();
    }
    WriteChunk(std::move(events), /*last=*/false, [this](bool ok) {
      if (!ok) {
        peer_gone_ = true;
        keep_alive_ = false;
      }
      if (call_) call_->WriteDone(ok);
    });
  }

  void OnFinishStream(const grpc::Status& status) {
    if (status.ok()) {
      std::string tail;
      if (include_usage_) tail += openai::UsageEvent(who_, usage_);
      tail += openai::kDoneEvent;
      return WriteChunk(std::move(tail), /*last=*/true, [this](bool ok) {
        if (!ok) peer_gone_ = true;
        EndCall();
        AfterCall();
      });
    }
    if (peer_gone_) {
      EndCall();
      return Close();
    }
    if (!headers_sent_) {
      EndCall();
      return SendStatus(status);
    }
    // Headers are out: the error travels as one more event, then the stream ends.
    keep_alive_ = false;
    std::string tail = openai::ErrorEvent(openai::HttpStatusOf(status.error_code()), status.error_message());
    tail += openai::kDoneEvent;
    WriteChunk(std::move(tail), /*last=*/true, [this](bool) {
      EndCall();
      AfterCall();
    });
  }

  void OnFinishUnary(v1::GenerateReply reply, const grpc::Status& status) {
    EndCall();
    if (peer_gone_) return Close();
    if (!status.ok()) return SendStatus(status);
    SendResponse(200, "application/json", openai::ReplyBody(who_, reply));
  }

  // The call is over for this reactor (its Finish came); the connection may go on.
  void EndCall() {
    if (!call_) return;
    call_->ReactorDone();
    call_.reset();
    service().HttpCallEnded();
    service().ReactorDone();
    self_ref_.reset();  // the handler running this holds another reference
  }

  void AfterCall() {
    if (!keep_alive_ || peer_gone_) return Close();
    if (watching_) {  // the watch read must end before the next request's read starts
      resume_read_ = true;
      beast::error_code ignored;
      tcp().socket().cancel(ignored);
      return;
    }
    DoRead();
  }

  // One SSE chunk (the response head first when not yet sent); `last` ends the chunked body.
  template <class Done>
  void WriteChunk(std::string events, bool last, Done done) {
    std::string out;
    if (!headers_sent_) {
      headers_sent_ = true;
      chunked_ = request_.version() >= 11;
      if (!chunked_) keep_alive_ = false;
      absl::StrAppend(&out, "HTTP/1.", request_.version() >= 11 ? "1" : "0",
                      " 200 OK\r\nServer: iris\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n",
                      "X-Request-Id: ", request_id_, "\r\n",
                      chunked_ ? "Transfer-Encoding: chunked\r\n" : "",
                      keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n", "\r\n");
    }
    if (chunked_) {
      if (!events.empty()) absl::StrAppend(&out, absl::StrFormat("%x", events.size()), "\r\n", events, "\r\n");
      if (last) out += "0\r\n\r\n";
    } else {
      out += events;
    }
    write_buf_ = std::move(out);
    tcp().expires_after(ToChrono(options().http_write_timeout));
    net::async_write(stream_, net::buffer(write_buf_),
                     [self = this->shared_from_this(), done](beast::error_code ec, size_t) mutable {
                       self->tcp().expires_never();
                       done(!ec);
                     });
  }

  void SendStatus(const grpc::Status& status) {
    const std::string message = status.error_message();
    SendError(openai::HttpStatusOf(status.error_code()), message, openai::ParamOf(message));
  }

  void SendError(int status, std::string_view message, std::string_view param = {}) {
    SendResponse(status, "application/json", openai::ErrorBody(status, message, param));
  }

  void SendResponse(int status, const char* content_type, std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status),
                                                                    request_.version() ? request_.version() : 11);
    res->set(http::field::server, "iris");
    res->set(http::field::content_type, content_type);
    if (status == 401) res->set(http::field::www_authenticate, "Bearer");
    if (!request_id_.empty()) res->set("X-Request-Id", request_id_);
    res->keep_alive(keep_alive_);
    res->body() = std::move(body);
    res->prepare_payload();
    tcp().expires_after(ToChrono(options().http_write_timeout));
    http::async_write(stream_, *res, [self = this->shared_from_this(), res](beast::error_code ec, size_t) {
      self->tcp().expires_never();
      self->request_id_.clear();
      if (ec) return self->Close();
      self->AfterCall();
    });
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    tcp().socket().shutdown(tcp::socket::shutdown_both, ignored);
    tcp().close();
  }

  const Shared* const shared_;
  Stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::string write_buf_;
  int64_t requests_ = 0;
  bool keep_alive_ = true;
  bool closed_ = false;
  // The generation in progress.
  std::shared_ptr<Session> self_ref_;
  std::shared_ptr<GenerateCall> call_;
  openai::Endpoint endpoint_ = openai::Endpoint::kChatCompletions;
  openai::ReplyIdentity who_;
  std::string request_id_;  // for the X-Request-Id response header
  bool streaming_ = false;
  bool include_usage_ = false;
  bool first_chunk_ = true;
  bool headers_sent_ = false;
  bool chunked_ = true;
  bool watching_ = false;
  bool resume_read_ = false;
  bool peer_gone_ = false;
  v1::Usage usage_;
};

}  // namespace

class HttpServer::Impl {
 public:
  Impl(IrisService* service, const ServerOptions& options, Mode mode)
      : ioc_(std::max(1, options.http_threads)), acceptor_(ioc_) {
    shared_.service = service;
    shared_.options = options;
    shared_.mode = mode;
    shared_.started =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  }

  absl::Status Listen(int port) {
    try {
      if (!shared_.options.tls_cert_pem.empty()) {
        ssl_.emplace(net::ssl::context::tls_server);
        ssl_->set_options(net::ssl::context::default_workarounds | net::ssl::context::no_sslv2 |
                          net::ssl::context::no_sslv3 | net::ssl::context::no_tlsv1 | net::ssl::context::no_tlsv1_1);
        ssl_->use_certificate_chain(net::buffer(shared_.options.tls_cert_pem));
        ssl_->use_private_key(net::buffer(shared_.options.tls_key_pem), net::ssl::context::pem);
      }
      tcp::resolver resolver(ioc_);
      const auto results = resolver.resolve(shared_.options.host, std::to_string(port),
                                            tcp::resolver::passive | tcp::resolver::numeric_service);
      if (results.empty()) return absl::UnavailableError("no address");
      const tcp::endpoint endpoint = results.begin()->endpoint();
      acceptor_.open(endpoint.protocol());
      acceptor_.set_option(net::socket_base::reuse_address(true));
      acceptor_.bind(endpoint);
      acceptor_.listen(net::socket_base::max_listen_connections);
      port_ = acceptor_.local_endpoint().port();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen for HTTP on ", shared_.options.host, ":", port, " (", e.what(), ")"));
    }
    Accept();
    for (int i = 0; i < std::max(1, shared_.options.http_threads); ++i) {
      threads_.emplace_back([this] {
        for (;;) {
          try {
            ioc_.run();
            return;
          } catch (const std::exception& e) {
            std::fprintf(stderr, "iris-server: HTTP handler error: %s\n", e.what());
          }
        }
      });
    }
    return absl::OkStatus();
  }

  void Stop() {
    if (stopped_.exchange(true)) return;
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  int port() const { return port_; }

 private:
  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
      if (!ec) {
        socket.set_option(tcp::no_delay(true), ec);
        if (ssl_) {
          std::make_shared<Session<beast::ssl_stream<beast::tcp_stream>>>(&shared_, std::move(socket), *ssl_)->Run();
        } else {
          std::make_shared<Session<beast::tcp_stream>>(&shared_, std::move(socket))->Run();
        }
      }
      if (acceptor_.is_open()) Accept();
    });
  }

  net::io_context ioc_;
  tcp::acceptor acceptor_;
  std::optional<net::ssl::context> ssl_;
  Shared shared_;
  std::vector<std::thread> threads_;
  std::atomic<bool> stopped_{false};
  int port_ = 0;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(IrisService* service, const ServerOptions& options,
                                                              int port, Mode mode) {
  auto impl = std::make_unique<Impl>(service, options, mode);
  if (absl::Status st = impl->Listen(port); !st.ok()) return st;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
int HttpServer::port() const { return impl_->port(); }
void HttpServer::Stop() { impl_->Stop(); }

}  // namespace iris::server
