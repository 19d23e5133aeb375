-- wrk script of the HTTP benchmarks (bench/http_bench.sh, bench/batching_bench.sh): POSTs, as
-- JSON, the body in the file that $WRK_BODY names.
--   WRK_BODY=request.json wrk -s bench/wrk_post.lua http://HOST:PORT/v2/models/M/infer
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local path = os.getenv("WRK_BODY")
local file = assert(io.open(path or "", "rb"), "WRK_BODY must name a readable file")
wrk.body = file:read("*a")
file:close()
