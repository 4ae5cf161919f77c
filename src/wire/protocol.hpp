// The engine wire protocol: message types and fields, and the version both
// sides check in their hello. One gateway connection carries many requests,
// each named by a connection-local request number "rid" (the gateway's).
//
//   gateway -> engine                        engine -> gateway
//   hello  {v, secret}                       hello    {v, pid, models, tensor_models, devices,
//                                                      model_dir, config_digest, started_at, load_s,
//                                                      admission}
//   submit {rid, request, resume?,           accepted {rid, submission} | rejected {rid, error}
//           admitted_before?}                event    {rid, event}     (until a terminal event)
//          (admitted_before: an engine that died admitted it; counted as granted again)
//   infer  {rid, request}                    accepted {rid, submission} | rejected {rid, error}
//          (a TorchScript tensor request)     infer_done {rid, result | error}   (once)
//   cancel {rid}                             (a FailedEvent cancelled, or an infer_done
//                                             with error cancelled, follows)
//   withdraw {rid}                           withdrawn {rid, ok}  (ok: it left the queue,
//          (a queued request, to place           no event follows; else it goes on)
//           it on another engine)
//   state  {qid}                             state    {qid, admission, histograms, generated_tokens}
//                                            status   {status, admission, histograms,
//                                                      generated_tokens, counters} (every heartbeat)
//
// A frame that breaks the framing, a message of an unknown type, a wrong
// version or secret closes the connection with a logged reason. When a
// gateway's connection closes, the engine cancels that connection's requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vg::wire {

inline constexpr std::int64_t kProtocolVersion = 3;  // 2: hello carries admission; withdraw. 3: exact logprobs

/// The largest frame payload either side sends or accepts (bytes). Tensor
/// data travels as base64 (4 bytes per 3), so one tensor request or result
/// carries at most about 48 MiB of float32 values; a larger one is refused
/// with 413 before it is sent (the gateway) or ends with that error (the
/// engine's outputs), and never breaks the connection.
inline constexpr std::size_t kMaxFrameBytes = 64u << 20;

/// The file beside its socket where an engine that cannot start (exit 1)
/// writes why, one line: its supervisor shows it as the reason the engine's
/// devices are left out. An engine removes it when it starts.
inline std::string start_failure_path(const std::string& socket_path) { return socket_path + ".failed"; }

}  // namespace vg::wire
