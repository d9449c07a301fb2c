-- wrk script for benchmarks/sidebyside.py: POST one fixed JSON body with a bearer key.
--   BODY_FILE=body.json API_KEY=kvg-... wrk -t1 -c32 -d10s --latency -s post.lua URL
-- done() prints one machine-readable line (latencies in microseconds).
local file = assert(io.open(os.getenv("BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = file:read("*a")
file:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("API_KEY") or "none")

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'SIDEBYSIDE {"requests": %d, "duration_us": %d, "p50_us": %.1f, "p99_us": %.1f, ' ..
    '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
