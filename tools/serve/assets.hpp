#pragma once
/// \file
/// The dashboard's static files (tools/serve/assets/), embedded at build time.
namespace tenure::serve {

extern const char* const k_app_js;     ///< /assets/app.js
extern const char* const k_style_css;  ///< /assets/style.css

}  // namespace tenure::serve
