-- GCRA: the per-IP limit, up to `want` admissions at once, at most half
-- (rounded up) of those the client has left (src/backends/redis/rate.rs).
--
-- KEYS[1]: the client's key (its theoretical arrival time, µs).
-- ARGV[1] emission interval (µs), ARGV[2] burst, ARGV[3] want, ARGV[4]
-- refund (admissions taken earlier and not used, given back first),
-- ARGV[5] deadline (µs on Redis's clock; 0: none).
--
-- Reply: {granted, remaining, wait_us, now_us}:
-- - granted > 0: admitted; the admissions that would still be granted, and
--   the time until the quota is whole again;
-- - granted = 0: refused; remaining 0, the time until the next admission;
-- - granted = -1: past the deadline, nothing done ({-1, 0, 0, now_us}).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[5])
if deadline > 0 and now > deadline then
  return {-1, 0, 0, now}
end
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local want, refund = tonumber(ARGV[3]), tonumber(ARGV[4])
local tolerance = interval * (burst - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or now) - refund * interval
if tat < now then tat = now end
local fit = math.floor((now + tolerance - tat) / interval) + 1
local granted = math.max(0, math.min(want, math.ceil(fit / 2)))
local new_tat = tat + granted * interval
if new_tat > now then
  redis.call('SET', KEYS[1], new_tat, 'PX', math.ceil((new_tat - now) / 1000) + 1)
else
  redis.call('DEL', KEYS[1])
end
if granted == 0 then
  return {0, 0, tat - tolerance - now, now}
end
return {granted, fit - granted, new_tat - now, now}
