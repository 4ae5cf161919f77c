// CLI11 options built from the config_fields table, and their merge with the
// config file (see config_cli.hpp).
#include "config/config_cli.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "config/config_fields.hpp"
#include "config/config_file.hpp"
#include "device/device.hpp"

namespace vg {

ConfigFlags::ConfigFlags(CLI::App& app, std::span<const char* const> keys) {
  app.add_option("--config", config_path_,
                 "TOML config file with the same settings as the flags (keys in snake_case, e.g. max_batch = 8); "
                 "flags given win over it")
      ->type_name("FILE");
  for (const ConfigField& f : config_fields()) {
    if (!keys.empty() &&
        std::none_of(keys.begin(), keys.end(), [&](const char* k) { return std::string_view(k) == f.key; })) {
      continue;
    }
    const std::string flag = flag_name(f.key);
    CLI::Option* opt = std::visit(
        [&](auto member) -> CLI::Option* {
          auto& target = flags_.*member;
          using T = std::decay_t<decltype(target)>;
          if constexpr (std::is_same_v<T, bool>) {
            return app.add_flag(flag, target, f.help);
          } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
            // One value per occurrence (`--device a --device b`, or `--device
            // a,b`); the values given replace the default or file list.
            return app.add_option(flag, target, f.help)
                ->delimiter(',')
                ->allow_extra_args(false)
                ->capture_default_str();
          } else if constexpr (std::is_same_v<T, std::int64_t>) {
            CLI::Option* o = app.add_option(flag, target, f.help)->capture_default_str();
            if (f.bytes()) {
              // "64MiB" -> "67108864" before CLI11 reads the integer.
              o->transform(
                  [](const std::string& text) {
                    auto n = parse_bytes(text);
                    if (!n.ok()) throw CLI::ValidationError(n.error().message);
                    return std::to_string(*n);
                  })
                  ->type_name("BYTES");
            }
            return o;
          } else {
            return app.add_option(flag, target, f.help)->capture_default_str();
          }
        },
        f.member);
    options_.emplace_back(&f, opt);
  }
}

Result<ServeConfig> ConfigFlags::resolve() const {
  ServeConfig out;
  if (!config_path_.empty()) {
    auto file = load_config_file(config_path_);
    if (!file.ok()) return std::move(file).error();
    out = *file;
  }
  for (const auto& [field, opt] : options_) {
    if (opt->count() > 0) copy_config_field(*field, flags_, out);
  }
  if (Status st = out.validate(); !st.ok()) return st.error();
  return out;
}

}  // namespace vg
