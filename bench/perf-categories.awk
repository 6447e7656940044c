# Groups a flat perf profile into where-the-time-goes categories.
#
# Input: `perf report --no-children --stdio -g none --sort dso,sym` (lines like
# "  3.38%  libc.so.6  [.] __memmove_evex_unaligned_erms").
# Variables: us_per_req (CPU microseconds per request in the profiled run; 0 = unknown).
# Output: one markdown table row per category, largest first: | category | share | µs/request |
#
# A Rust symbol is charged to the first crate named in it, so
# `core::ptr::drop_in_place<hyper_util::...>` counts as hyper-util.

function crate_of(sym,    best, bi, i, p, n) {
  n = split("rondo_|hyper_util::|hyper::|tokio::|mio::|http::|httparse::|bytes::|core::fmt|alloc::fmt|core::hash::sip|std::time", prefixes, "|")
  best = 0; bi = 0
  for (i = 1; i <= n; i++) {
    p = index(sym, prefixes[i])
    if (p > 0 && (best == 0 || p < best)) { best = p; bi = i }
  }
  if (bi == 0) return ""
  return prefixes[bi]
}

function category(dso, sym,    c) {
  if (dso ~ /kernel/) {
    if (sym ~ /^_raw_spin_unlock_irqrestore|^try_to_wake_up|^native_write_msr|^__wake_up|^ttwu_|^default_wake_function|^ep_poll_callback/)
      return "kernel: waking the peer (loopback delivery -> sock_def_readable -> wake-up, IPI)"
    return "kernel: TCP/IP stack, syscalls, epoll"
  }
  if (sym ~ /^(malloc|_int_malloc|_int_free|cfree|free|malloc_consolidate|unlink_chunk|realloc|_int_realloc|calloc|tcache_|__libc_malloc|__libc_free|__libc_calloc|__libc_realloc|__rust_alloc|__rust_dealloc|__rust_realloc|__rustc::__r)/)
    return "allocator (glibc malloc/free)"
  if (sym ~ /^__(memmove|memcpy|memset|memcmp|memchr|strlen)/) return "libc memmove/memcpy/memcmp"
  if (dso ~ /vdso/ || sym ~ /clock_gettime/) return "clock reads (clock_gettime)"
  if (dso ~ /^libc/) return "libc syscall wrappers and other libc"
  c = crate_of(sym)
  if (c == "rondo_") return "rondo's own code (rondo_proxy, rondo_runtime, rondo_core)"
  if (c == "hyper_util::") return "hyper-util (pooled client: checkout, connector, pool keys)"
  if (c == "hyper::") return "hyper (HTTP/1 codec, dispatch, body channels)"
  if (c == "tokio::" || c == "mio::") return "tokio (scheduler, I/O readiness, timers, channels)"
  if (c == "http::" || c == "httparse::") return "http/httparse (HeaderMap, Uri, parsing)"
  if (c == "bytes::") return "bytes (Bytes/BytesMut refcounts)"
  if (c == "core::fmt" || c == "alloc::fmt") return "string formatting (core::fmt)"
  if (c == "core::hash::sip") return "SipHash (std HashMap keys)"
  if (c == "std::time") return "clock reads (clock_gettime)"
  if (dso ~ /kernel|vdso|libc/) return "other"
  return dso == "" ? "other" : "other code in " dso
}

/%/ && $1 ~ /%$/ && $3 ~ /^\[/ {
  pct = $1; sub(/%$/, "", pct)
  dso = $2
  sym = $0
  sub(/^[ \t]*[0-9.]+%[ \t]+[^ \t]+[ \t]+\[[^]]*\][ \t]+/, "", sym)
  share[category(dso, sym)] += pct
  total += pct
}

END {
  n = 0
  for (c in share) names[++n] = c
  for (i = 1; i <= n; i++)
    for (j = i + 1; j <= n; j++)
      if (share[names[j]] > share[names[i]]) { t = names[i]; names[i] = names[j]; names[j] = t }
  for (i = 1; i <= n; i++) {
    c = names[i]
    if (us_per_req > 0)
      printf "| %s | %.1f%% | %.2f |\n", c, share[c], share[c] / 100 * us_per_req
    else
      printf "| %s | %.1f%% | – |\n", c, share[c]
  }
}
