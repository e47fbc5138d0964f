-- QUOTA: a client's read quota (src/backends/redis/read_quota.rs). Gives
-- back first what a replica took earlier and did not hand out, then takes
-- what a reservation needs from the replica plus up to `ahead` reads for
-- its next requests: at most half (rounded down) of what is left after the
-- need, so that near the limit the takes shrink to the need.
--
-- KEYS[1]: the client's key: the instant its bucket is full again (µs on
-- this node's clock, fractions kept; absent: full now).
-- ARGV[1] one read's share of the period (ns), ARGV[2] burst, ARGV[3] take
-- (what the reservation needs beyond the replica's stock), ARGV[4] ahead
-- (the most to take for later), ARGV[5] give back, ARGV[6] deadline (µs on
-- this node's clock; 0: none).
--
-- Reply: {status, granted, wait_us, full_in_us, now_us}:
-- - status 1: `granted` reads taken (take and ahead), wait_us 0;
-- - status 0: refused, nothing taken (the give-back is done); wait_us until
--   `take` would fit;
-- - status -1: past the deadline, nothing done ({-1, 0, 0, 0, now_us}).
-- full_in_us: until the bucket is full again, after this call.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[6])
if deadline > 0 and now > deadline then
  return {-1, 0, 0, 0, now}
end
local interval = tonumber(ARGV[1]) / 1000
local burst, take = tonumber(ARGV[2]), tonumber(ARGV[3])
local ahead, back = tonumber(ARGV[4]), tonumber(ARGV[5])
local full = tonumber(redis.call('GET', KEYS[1]) or now) - back * interval
if full < now then full = now end
-- Whole reads that fit now (a float's last bit is not a read owed).
local fit = burst - math.ceil((full - now) / interval - 1e-6)
local status, granted, wait = 0, 0, 0
if take <= fit then
  status = 1
  granted = take + math.max(0, math.min(ahead, math.floor((fit - take) / 2)))
  full = full + granted * interval
else
  wait = math.ceil(full + (take - burst) * interval - now)
end
if status == 1 or back > 0 then
  if full > now then
    redis.call('SET', KEYS[1], full, 'PX', math.ceil((full - now) / 1000) + 1)
  else
    redis.call('DEL', KEYS[1])
  end
end
return {status, granted, wait, math.ceil(full - now), now}
