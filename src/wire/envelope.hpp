// The envelopes of the engine wire protocol (protocol.hpp): a message of
// either direction to its frame, and a frame's payload back to the message.
// Decoding is as strict as the payload codecs (codec.hpp): an unknown type,
// a missing or wrongly typed field, or a payload that is not a JSON object
// is a DecodeError value, never an exception or a crash. Pure; any thread.
#pragma once

#include <string>
#include <string_view>

#include "wire/protocol.hpp"

namespace vg::wire {

/// The frame (frame.hpp: length prefix + JSON payload) of `message`.
std::string encode_frame(const ToEngine& message);
std::string encode_frame(const ToGateway& message);

/// The message a frame's `payload` holds (FrameReader::next() gives it), or
/// the DecodeError saying why it holds none.
Decoded<ToEngine> decode_to_engine(std::string_view payload);
Decoded<ToGateway> decode_to_gateway(std::string_view payload);

/// The wire name of a message's type ("submit", "event", ...), for logs.
std::string_view type_name(const ToEngine& message);
std::string_view type_name(const ToGateway& message);

}  // namespace vg::wire
