// The live page served at GET / (and /index.html): one HTML file with its
// script and style sheet (src/http/page/), compiled into the binary, making no
// request to another host. Pure lookups of constant data; any thread.
#pragma once

#include <string_view>

namespace vg::httpd {

/// One file of the page.
struct PageFile {
  std::string_view body;
  std::string_view content_type;
};

/// The page's file served at `path` ("/", "/index.html", "/page/app.js",
/// "/page/app.css"), or nullptr for any other path.
const PageFile* find_page_file(std::string_view path);

/// Content-Security-Policy of every page file: only this origin's scripts,
/// styles and fetches; no frames, no plugins, no form posts elsewhere.
inline constexpr std::string_view kPageCsp =
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

namespace page_files {
// Defined in the generated page_files.cpp (src/CMakeLists.txt).
std::string_view index_html();
std::string_view app_js();
std::string_view app_css();
}  // namespace page_files

}  // namespace vg::httpd
