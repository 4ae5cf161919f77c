// The shared queue's scripts and helpers (see shared_queue.hpp).
#include "queue/shared_queue.hpp"

#include <charconv>

namespace vg::queue {

bool valid_queue_id(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

std::string format_ids(const std::vector<std::int32_t>& ids) {
  std::string out;
  for (std::int32_t id : ids) {
    out += std::to_string(id);
    out += ',';
  }
  return out;
}

Result<std::vector<std::int32_t>> parse_ids(const std::string& text, std::size_t max) {
  std::vector<std::int32_t> out;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  while (p < end) {
    std::int32_t v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || next == p || v < 0) {
      return Error(ErrorCode::kInvalidRequest, "token ids: not a list of non-negative integers");
    }
    out.push_back(v);
    if (out.size() > max) return Error(ErrorCode::kInvalidRequest, "token ids: more than " + std::to_string(max));
    p = next;
    if (p < end) {
      if (*p != ',') return Error(ErrorCode::kInvalidRequest, "token ids: expected ','");
      ++p;
    }
  }
  return out;
}

std::optional<std::pair<std::uint64_t, std::uint64_t>> parse_stream_id(const std::string& id) {
  const auto dash = id.find('-');
  if (dash == std::string::npos) return std::nullopt;
  std::uint64_t ms = 0;
  std::uint64_t seq = 0;
  auto [e1, c1] = std::from_chars(id.data(), id.data() + dash, ms);
  auto [e2, c2] = std::from_chars(id.data() + dash + 1, id.data() + id.size(), seq);
  if (c1 != std::errc() || c2 != std::errc() || e1 != id.data() + dash || e2 != id.data() + id.size() || dash == 0 ||
      dash + 1 == id.size()) {
    return std::nullopt;
  }
  return std::make_pair(ms, seq);
}

namespace {

RedisClient::Args eval_args(const char* script, RedisClient::Args keys, RedisClient::Args args) {
  RedisClient::Args argv;
  argv.reserve(3 + keys.size() + args.size());
  argv.emplace_back("EVAL");
  argv.emplace_back(script);
  argv.push_back(std::to_string(keys.size()));
  for (auto& k : keys) argv.push_back(std::move(k));
  for (auto& a : args) argv.push_back(std::move(a));
  return argv;
}

Result<RedisValue> check_reply(Result<RedisValue> r) {
  if (!r) return r;
  if (r->is_error()) return Error(ErrorCode::kInternal, "redis script: " + *r->as_error());
  return r;
}

std::optional<std::int64_t> as_int(const RedisValue& v) {
  if (auto i = v.as_integer()) return i;
  if (const std::string* s = v.as_string()) {
    std::int64_t out = 0;
    auto [end, ec] = std::from_chars(s->data(), s->data() + s->size(), out);
    if (ec == std::errc() && end == s->data() + s->size() && !s->empty()) return out;
  }
  return std::nullopt;
}

}  // namespace

Result<RedisValue> eval_sync(RedisClient& client, const char* script, RedisClient::Args keys, RedisClient::Args args,
                             Duration timeout) {
  return check_reply(client.command_sync(eval_args(script, std::move(keys), std::move(args)), timeout));
}

void eval_async(RedisClient& client, const char* script, RedisClient::Args keys, RedisClient::Args args,
                Duration timeout, std::function<void(Result<RedisValue>)> done) {
  client.command(eval_args(script, std::move(keys), std::move(args)), timeout,
                 [done = std::move(done)](Result<RedisValue> r) { done(check_reply(std::move(r))); });
}

const std::string* TakenEntry::field(const std::string& name) const {
  for (const auto& [k, v] : fields) {
    if (k == name) return &v;
  }
  return nullptr;
}

Result<std::optional<TakenEntry>> decode_taken(const RedisValue& v, const std::vector<std::string>& streams) {
  if (v.is_nil()) return std::optional<TakenEntry>();
  if (auto i = v.as_integer(); i && *i == 0) return std::optional<TakenEntry>();  // Lua false
  const auto* a = v.as_array();
  const auto bad = [&] {
    return Error(ErrorCode::kInternal, "redis take: unexpected reply " + v.debug_string().substr(0, 300));
  };
  if (a == nullptr || a->size() < 4) return bad();
  auto index = as_int((*a)[0]);
  const std::string* id = (*a)[1].as_string();
  const auto* flat = (*a)[2].as_array();
  const std::string* outcome = (*a)[3].as_string();
  if (!index || *index < 0 || static_cast<std::size_t>(*index) >= streams.size() || id == nullptr ||
      flat == nullptr || outcome == nullptr || flat->size() % 2 != 0) {
    return bad();
  }
  TakenEntry e;
  e.stream = streams[static_cast<std::size_t>(*index)];
  e.id = *id;
  e.outcome = *outcome;
  for (std::size_t i = 0; i < flat->size(); i += 2) {
    const std::string* k = (*flat)[i].as_string();
    const std::string* val = (*flat)[i + 1].as_string();
    if (k == nullptr || val == nullptr) return bad();
    e.fields.emplace_back(*k, *val);
  }
  if (a->size() >= 10) {
    auto seq = as_int((*a)[9]);
    if (!seq) return bad();
    e.seq = *seq;
  }
  if (a->size() >= 9) {
    auto epoch = as_int((*a)[4]);
    const std::string* ids = (*a)[5].as_string();
    const std::string* sent = (*a)[6].as_string();
    const std::string* out = (*a)[7].as_string();
    auto deliveries = as_int((*a)[8]);
    if (!epoch || ids == nullptr || sent == nullptr || out == nullptr || !deliveries) return bad();
    e.epoch = *epoch;
    e.ids = *ids;
    e.prompt_sent = *sent == "1";
    e.output_sent = *out == "1";
    e.deliveries = *deliveries;
  }
  return std::optional<TakenEntry>(std::move(e));
}

// Lua shared by the scripts. fanout(h, prefix, epoch,
// ev, maxlen): writes an event to the reply stream of every gateway that
// follows request hash h (a client that sent the same Idempotency-Key to
// another gateway; members "gw|its rid"). forget(h, completed): the request
// ended; its Idempotency-Key (if any) is kept with its history for replay
// when it completed and the key has a ttl, else freed (so a retry runs
// again); the request's keys are deleted. entry_ids(fields): a stream
// entry's rid and gw, or nil when either is missing or not a valid id.
#define VG_LUA_HELPERS                                                                                      \
  "local function fanout(h, prefix, epoch, ev, maxlen)\n"                                                \
  "  for _, m in ipairs(redis.call('SMEMBERS', h .. ':f')) do\n"                                          \
  "    local bar = string.find(m, '|', 1, true)\n"                                                          \
  "    if bar then\n"                                                                                       \
  "      redis.call('XADD', prefix .. ':gw:' .. string.sub(m, 1, bar - 1) .. ':out', 'MAXLEN', '~', maxlen,\n" \
  "                 '*', 'rid', string.sub(m, bar + 1), 'epoch', epoch, 'ev', ev)\n"                        \
  "    end\n"                                                                                               \
  "  end\n"                                                                                                 \
  "end\n"                                                                                                   \
  "local function entry_ids(f)\n"                                                                        \
  "  local rid, gw\n"                                                                                      \
  "  for j = 1, #f, 2 do\n"                                                                                \
  "    if f[j] == 'rid' then rid = f[j + 1] elseif f[j] == 'gw' then gw = f[j + 1] end\n"                \
  "  end\n"                                                                                                \
  "  if rid == nil or gw == nil or not string.match(rid, '^[%w_.-]+$') or not string.match(gw, '^[%w_.-]+$') then\n" \
  "    return nil, nil\n"                                                                                  \
  "  end\n"                                                                                                \
  "  return rid, gw\n"                                                                                     \
  "end\n"                                                                                                  \
  "local function forget(h, completed)\n"                                                                 \
  "  local f = redis.call('HMGET', h, 'idem', 'ittl')\n"                                                  \
  "  if f[1] then\n"                                                                                        \
  "    if completed and tonumber(f[2] or '0') > 0 and redis.call('HGET', f[1], 'req') == h then\n"       \
  "      redis.call('HSET', f[1], 'state', 'done')\n"                                                     \
  "      redis.call('PEXPIRE', f[1], f[2])\n"                                                               \
  "      redis.call('PEXPIRE', h .. ':h', f[2])\n"                                                          \
  "    else\n"                                                                                              \
  "      if redis.call('HGET', f[1], 'req') == h then redis.call('DEL', f[1]) end\n"                      \
  "      redis.call('DEL', h .. ':h')\n"                                                                    \
  "    end\n"                                                                                               \
  "  end\n"                                                                                                 \
  "  redis.call('DEL', h, h .. ':ids', h .. ':f')\n"                                                      \
  "end\n"

// ADD. KEYS: class stream, request hash, its ids, waiting counter, bell,
// the gateway's alive key, and for a request with an Idempotency-Key that
// key's hash. ARGV: cost, rid, gateway, request (JSON), ttl ms, class,
// epoch base, ids sent so far, prompt sent (0/1), output sent (0/1), group,
// alive ms (the add also refreshes the gateway's alive key, so an entry is
// never added under a lapsed one), then with a key: the request's
// fingerprint, the key's replay ttl ms, this request as a follower
// ("gw|rid"), the prefix; an empty fingerprint is a re-add after Redis
// lost the request (its key is freed if it still names it, nothing recorded).
// Returns {1, waiting, entry id}; {0, waiting} when the request is already
// there (a re-add after a Redis restart that kept its data); {2} when the
// key names a live request with another fingerprint; {3, its hash, state
// ("run" or "done"), its events so far (XRANGE of its history), its
// gateway, its waiting counter, its class stream} when it names a live
// one with this fingerprint: a running one now also writes its events to
// this gateway (the follower is added in the same step, so no event is
// missed or doubled).
const char kAddScript[] = R"lua(
redis.call('SET', KEYS[6], '1', 'PX', ARGV[12])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return {0, tonumber(redis.call('GET', KEYS[4]) or '0')}
end
if KEYS[7] and ARGV[13] == '' then
  -- A re-add after Redis lost the request: its events so far are gone, so
  -- its key is freed (a retry elsewhere runs anew) and it records nothing.
  if redis.call('HGET', KEYS[7], 'req') == KEYS[2] then redis.call('DEL', KEYS[7]) end
elseif KEYS[7] then
  local e = redis.call('HMGET', KEYS[7], 'req', 'fp', 'state')
  if e[1] and e[1] ~= KEYS[2] then
    local live = false
    local gw = ''
    if e[3] == 'done' then
      live = redis.call('EXISTS', e[1] .. ':h') == 1
    else
      local o = redis.call('HMGET', e[1], 'gw', 'cancel')
      if o[1] and o[2] ~= '1' then
        gw = o[1]
        live = redis.call('EXISTS', ARGV[16] .. ':gw:' .. gw .. ':alive') == 1
      end
    end
    if live then
      if e[2] ~= ARGV[13] then return {2} end
      local tag = string.match(e[1], '^(.*):r:[^:]+$') or ''
      local cls = ''
      if e[3] ~= 'done' then
        redis.call('SADD', e[1] .. ':f', ARGV[15])
        redis.call('PEXPIRE', e[1] .. ':f', ARGV[5])
        cls = redis.call('HGET', e[1], 'cls') or '0'
      end
      return {3, e[1], e[3], redis.call('XRANGE', e[1] .. ':h', '-', '+'), gw, tag .. ':waiting', tag .. ':c' .. cls}
    end
  end
  redis.call('DEL', KEYS[7])
  redis.call('HSET', KEYS[7], 'req', KEYS[2], 'fp', ARGV[13], 'state', 'run')
  redis.call('PEXPIRE', KEYS[7], ARGV[5])
end
redis.pcall('XGROUP', 'CREATE', KEYS[1], ARGV[11], '0', 'MKSTREAM')
local id = redis.call('XADD', KEYS[1], '*', 'cost', ARGV[1], 'rid', ARGV[2], 'gw', ARGV[3], 'req', ARGV[4])
redis.call('HSET', KEYS[2], 'epoch', ARGV[7], 'taken', 0, 'cancel', 0, 'gw', ARGV[3], 'entry', id, 'cls', ARGV[6],
           'sent', ARGV[9], 'out', ARGV[10])
if KEYS[7] and ARGV[13] ~= '' then redis.call('HSET', KEYS[2], 'idem', KEYS[7], 'ittl', ARGV[14]) end
redis.call('PEXPIRE', KEYS[2], ARGV[5])
redis.call('DEL', KEYS[3])
if ARGV[8] ~= '' then redis.call('SET', KEYS[3], ARGV[8], 'PX', ARGV[5]) end
local n = redis.call('INCR', KEYS[4])
redis.call('RPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], -8, -1)
return {1, n, id}
)lua";

// TAKE. KEYS: class streams to try, largest first. ARGV: group, consumer,
// model tag (P:{M}), prefix (P). Reads one new entry (XREADGROUP) and takes
// it: {index, id, fields, 'ok', epoch, ids, sent, out, 1}; a cancelled one
// or one of a gone gateway is acknowledged and removed: {index, id,
// fields, 'skip'}; one without rid or gw: {index, id, fields, 'bad'}; none: false.
const char kTakeScript[] = VG_LUA_HELPERS R"lua(
for i, key in ipairs(KEYS) do
  local r = redis.pcall('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', 1, 'STREAMS', key, '>')
  if type(r) == 'table' and r.err == nil and r[1] ~= nil and r[1][2][1] ~= nil then
    local e = r[1][2][1]
    local id, f = e[1], e[2]
    local rid, gw = entry_ids(f)
    if rid == nil then return {i - 1, id, f, 'bad'} end
    local h = ARGV[3] .. ':r:' .. rid
    local s = redis.call('HMGET', h, 'epoch', 'taken', 'cancel')
    if s[1] == false or s[3] == '1' or redis.call('EXISTS', ARGV[4] .. ':gw:' .. gw .. ':alive') == 0 then
      redis.call('XACK', key, ARGV[1], id)
      redis.call('XDEL', key, id)
      if s[1] ~= false then
        if s[2] == '0' then redis.call('DECR', ARGV[3] .. ':waiting') end
        forget(h, false)
      end
      return {i - 1, id, f, 'skip'}
    end
    local n = redis.call('HINCRBY', h, 'epoch', 1)
    if s[2] == '0' then redis.call('DECR', ARGV[3] .. ':waiting') end
    redis.call('HSET', h, 'taken', 1)
    local fl = redis.call('HMGET', h, 'sent', 'out', 'seq')
    return {i - 1, id, f, 'ok', n, redis.call('GET', h .. ':ids') or '', fl[1] or '0', fl[2] or '0', 1,
            tonumber(fl[3] or '0')}
  end
end
return false
)lua";

// CLAIM. KEYS: class streams, largest first. ARGV: group, consumer, min
// idle ms, model tag, prefix, most deliveries, the failed event (JSON) a
// dead letter's gateway gets, reply stream length bound. Claims one entry
// idle longer than min idle (XAUTOCLAIM: its delivery count goes up),
// replying as TAKE does; 'dead' when it was delivered more than most
// deliveries times (dead-lettered, its gateway told, removed).
const char kClaimScript[] = VG_LUA_HELPERS R"lua(
for i, key in ipairs(KEYS) do
  local r = redis.pcall('XAUTOCLAIM', key, ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', 1)
  if type(r) == 'table' and r.err == nil and r[2] ~= nil and r[2][1] ~= nil and r[2][1] ~= false then
    local e = r[2][1]
    local id, f = e[1], e[2]
    local rid, gw = entry_ids(f)
    if rid == nil then return {i - 1, id, f, 'bad'} end
    local p = redis.call('XPENDING', key, ARGV[1], id, id, 1)
    local d = 1
    if p[1] ~= nil then d = p[1][4] end
    local h = ARGV[4] .. ':r:' .. rid
    local s = redis.call('HMGET', h, 'epoch', 'cancel', 'sent', 'out', 'seq')
    if s[1] == false or s[2] == '1' or redis.call('EXISTS', ARGV[5] .. ':gw:' .. gw .. ':alive') == 0 then
      redis.call('XACK', key, ARGV[1], id)
      redis.call('XDEL', key, id)
      forget(h, false)
      return {i - 1, id, f, 'skip'}
    end
    local n = redis.call('HINCRBY', h, 'epoch', 1)
    if d > tonumber(ARGV[6]) then
      redis.call('XADD', ARGV[4] .. ':dead', 'MAXLEN', '~', 1000, '*', 'rid', rid, 'gw', gw, 'entry', id,
                 'reason', 'delivered ' .. d .. ' times')
      redis.call('XADD', ARGV[5] .. ':gw:' .. gw .. ':out', 'MAXLEN', '~', ARGV[8], '*', 'rid', rid, 'epoch', n,
                 'ev', ARGV[7])
      fanout(h, ARGV[5], n, ARGV[7], ARGV[8])
      redis.call('XACK', key, ARGV[1], id)
      redis.call('XDEL', key, id)
      forget(h, false)
      return {i - 1, id, f, 'dead', n, '', '0', '0', d}
    end
    redis.call('HSET', h, 'taken', 1)
    return {i - 1, id, f, 'ok', n, redis.call('GET', h .. ':ids') or '', s[3] or '0', s[4] or '0', d,
            tonumber(s[5] or '0')}
  end
end
return false
)lua";

// EMIT (a batch of one request's events, in order). KEYS: request hash,
// its ids, the gateway's reply stream, the gateway's alive key, the class
// stream. ARGV: epoch, sequence number of the first event (1-based over the
// request's life, across deliveries), ttl ms, reply length bound, rid,
// group, entry id, count, then per event: the event (JSON), the ids it
// adds ("" none), flags ("p" prompt logprobs sent, "o" output sent, "t"
// terminal, "c" completed: a terminal event that is the answer), then the
// prefix. A request with an Idempotency-Key also records each event in its
// history (replayed to a client that sends the key again) and writes it to
// its followers. Events already written (a retry after a lost reply) are
// skipped, so a batch may be sent again safely. Returns 1 written (a
// terminal one also acknowledges and removes the request); -1 cancelled (a
// terminal one then removes it); -2 the request is gone (finished, or Redis
// lost it); -3 another delivery holds it; -4 a gap (events before this
// batch are missing); -5 the gateway's alive key is missing (nothing
// written: the caller tries again, and gives up after a grace period).
const char kEmitScript[] = VG_LUA_HELPERS R"lua(
local s = redis.call('HMGET', KEYS[1], 'epoch', 'cancel', 'seq', 'idem')
if s[1] == false then return -2 end
if s[1] ~= ARGV[1] then return -3 end
local n = tonumber(ARGV[8])
local prefix = ARGV[9 + 3 * n]
local terminal, completed = false, false
for i = 0, n - 1 do
  if string.find(ARGV[11 + 3 * i], 't', 1, true) then terminal = true end
  if string.find(ARGV[11 + 3 * i], 'c', 1, true) then completed = true end
end
local function finish(answered)
  redis.call('XACK', KEYS[5], ARGV[6], ARGV[7])
  redis.call('XDEL', KEYS[5], ARGV[7])
  forget(KEYS[1], answered)
end
if s[2] == '1' then
  if terminal then finish(false) end
  return -1
end
if redis.call('EXISTS', KEYS[4]) == 0 then return -5 end
local done = tonumber(s[3] or '0')
local first = tonumber(ARGV[2])
if first > done + 1 then return -4 end
for i = 0, n - 1 do
  local q = first + i
  if q > done then
    local ev, ids, flags = ARGV[9 + 3 * i], ARGV[10 + 3 * i], ARGV[11 + 3 * i]
    if ids ~= '' then redis.call('APPEND', KEYS[2], ids) end
    if string.find(flags, 'p', 1, true) then redis.call('HSET', KEYS[1], 'sent', 1) end
    if string.find(flags, 'o', 1, true) then redis.call('HSET', KEYS[1], 'out', 1) end
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'rid', ARGV[5], 'epoch', ARGV[1], 'ev', ev)
    if s[4] and prefix then
      redis.call('XADD', KEYS[1] .. ':h', '*', 'epoch', ARGV[1], 'ev', ev)
      redis.call('PEXPIRE', KEYS[1] .. ':h', ARGV[3])
      fanout(KEYS[1], prefix, ARGV[1], ev, ARGV[4])
    end
    done = q
  end
end
if terminal then
  finish(completed)
else
  redis.call('HSET', KEYS[1], 'seq', done)
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 1
)lua";

// TOUCH (a holder's heartbeat). KEYS: triples of class stream, request
// hash and the request's gateway's alive key. ARGV: group, consumer, then
// pairs of entry id and epoch. Resets the idle time of each entry still
// held under its epoch, not cancelled and with its gateway alive (XCLAIM
// JUSTID does not count a delivery). Returns per triple 1 (still held), 0
// (stop it: cancelled, claimed by another, or gone) or 2 (held, but its
// gateway's alive key is missing: the caller gives up after a grace period).
const char kTouchScript[] = R"lua(
local out = {}
for i = 1, #KEYS, 3 do
  local j = 3 + 2 * ((i - 1) / 3)
  local s = redis.call('HMGET', KEYS[i + 1], 'epoch', 'cancel')
  if s[1] == ARGV[j + 1] and s[2] ~= '1' then
    redis.call('XCLAIM', KEYS[i], ARGV[1], ARGV[2], 0, ARGV[j], 'JUSTID')
    if redis.call('EXISTS', KEYS[i + 2]) == 1 then out[#out + 1] = 1 else out[#out + 1] = 2 end
  else
    out[#out + 1] = 0
  end
end
return out
)lua";

// CANCEL. KEYS: request hash, its ids, waiting counter, class stream.
// ARGV: only if not taken (0/1), and a follower ("gw|rid") leaving, or ""
// for the request's own gateway. Returns 0: it was not taken, and is
// removed; 1: taken, left running (only-if-not-taken); 2: taken, marked
// cancelled (its engine stops at its next event or heartbeat); 3: left
// running for the clients of other gateways that follow it (it is cancelled
// when the last of them leaves too); -1: gone.
const char kCancelScript[] = VG_LUA_HELPERS R"lua(
local s = redis.call('HMGET', KEYS[1], 'taken', 'entry', 'orphan')
if s[1] == false then return -1 end
local f = KEYS[1] .. ':f'
if ARGV[2] ~= nil and ARGV[2] ~= '' then
  redis.call('SREM', f, ARGV[2])
  if s[3] ~= '1' or redis.call('SCARD', f) > 0 then return 3 end
elseif ARGV[1] ~= '1' and redis.call('SCARD', f) > 0 then
  redis.call('HSET', KEYS[1], 'orphan', 1)
  return 3
end
if s[1] == '0' then
  redis.call('XDEL', KEYS[4], s[2])
  redis.call('DECR', KEYS[3])
  forget(KEYS[1], false)
  return 0
end
if ARGV[1] == '1' then return 1 end
redis.call('HSET', KEYS[1], 'cancel', 1)
return 2
)lua";

// DEAD LETTER of a malformed entry. KEYS: class stream, dead-letter
// stream. ARGV: group, entry id, reason.
const char kDeadLetterScript[] = R"lua(
redis.call('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'stream', KEYS[1], 'entry', ARGV[2], 'reason', ARGV[3])
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
return 1
)lua";

// VERIFY (a gateway's check that Redis still has its requests). KEYS: the
// gateway's reply stream, then request hashes (its own requests) or
// follower sets (requests of other gateways it follows). ARGV, one per key
// after the first: "" for a hash, "member alive-key" for a follower set.
// Returns {the reply stream's newest entry id ("0-0" when empty), {0-based
// indexes of the keys that are missing (a follower: no longer a member)},
// {indexes of followed requests whose gateway's alive key is missing}}: a
// missing request whose answer is not in the reply stream up to that id
// was lost (Redis lost data, or an engine dropped it while the gateway's
// alive key had lapsed) and is re-added; a lost followed one fails.
const char kVerifyScript[] = R"lua(
local last = '0-0'
local r = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
if r[1] ~= nil then last = r[1][1] end
local missing, orphaned = {}, {}
for i = 2, #KEYS do
  local a = ARGV[i - 1] or ''
  if a == '' then
    if redis.call('EXISTS', KEYS[i]) == 0 then missing[#missing + 1] = i - 2 end
  else
    local sp = string.find(a, ' ', 1, true)
    if redis.call('SISMEMBER', KEYS[i], string.sub(a, 1, sp - 1)) == 0 then missing[#missing + 1] = i - 2 end
    if redis.call('EXISTS', string.sub(a, sp + 1)) == 0 then orphaned[#orphaned + 1] = i - 2 end
  end
end
return {last, missing, orphaned}
)lua";

// PRUNE CONSUMERS (engines that are gone leave their consumer names in the
// groups). KEYS: class streams. ARGV: group, min idle ms, a consumer name
// (only that one) or "" (any). Deletes each consumer with nothing pending
// that has been idle longer than min idle (a live engine reads its classes
// every take, and one deleted by mistake is created again by its next
// read; one with pending entries is never deleted, which would drop them).
// Returns the number deleted.
const char kPruneConsumersScript[] = R"lua(
local n = 0
for _, key in ipairs(KEYS) do
  local cs = redis.pcall('XINFO', 'CONSUMERS', key, ARGV[1])
  if type(cs) == 'table' and cs.err == nil then
    for _, c in ipairs(cs) do
      local name, pending, idle
      for j = 1, #c, 2 do
        if c[j] == 'name' then name = c[j + 1] elseif c[j] == 'pending' then pending = c[j + 1]
        elseif c[j] == 'idle' then idle = c[j + 1] end
      end
      if name and pending == 0 and idle and idle > tonumber(ARGV[2]) and (ARGV[3] == '' or ARGV[3] == name) then
        redis.call('XGROUP', 'DELCONSUMER', key, ARGV[1], name)
        n = n + 1
      end
    end
  end
end
return n
)lua";

}  // namespace vg::queue
