// The page's files by path (see page.hpp).
#include "http/page.hpp"

#include <array>
#include <utility>

namespace vg::httpd {

const PageFile* find_page_file(std::string_view path) {
  static const std::array<std::pair<std::string_view, PageFile>, 4> kFiles = {{
      {"/", {page_files::index_html(), "text/html; charset=utf-8"}},
      {"/index.html", {page_files::index_html(), "text/html; charset=utf-8"}},
      {"/page/app.js", {page_files::app_js(), "text/javascript; charset=utf-8"}},
      {"/page/app.css", {page_files::app_css(), "text/css; charset=utf-8"}},
  }};
  for (const auto& [p, file] : kFiles) {
    if (p == path) return &file;
  }
  return nullptr;
}

}  // namespace vg::httpd
