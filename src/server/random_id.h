#pragma once
// Every identifier a client sees (chatcmpl-, cmpl-, resp_, call_, msg_/rs_/fc_ items, req-) is
// 128 bits from the kernel's CSPRNG. Ids are capabilities here: whoever knows a response id can
// read and continue that stored response, so one id must reveal nothing about another (issue 19:
// ids were a counter mixed with one salt, and from one id every other followed).
#include <string>
#include <string_view>

namespace ossrt::server {

// `prefix` followed by 32 lowercase hex digits (128 random bits from getrandom(2)).
std::string random_id(std::string_view prefix);

}  // namespace ossrt::server
