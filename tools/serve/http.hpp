#pragma once
/// \file
/// The HTTP types of `tenure serve`.
#include <boost/beast/http.hpp>

namespace tenure::serve {

namespace http = boost::beast::http;
using request = http::request<http::string_body>;
using response = http::response<http::string_body>;

}  // namespace tenure::serve
