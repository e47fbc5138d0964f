-- CLAIM: a replica's share of one host's cap (src/backends/redis/shares.rs).
--
-- KEYS[1]: the host's hash, one field per replica:
--   "<has> <wants> <expires (ms)> <short since (µs; 0: not short)>".
-- ARGV[1] holder (the replica), ARGV[2] floor (what the holder may have in
-- use until the answer arrives), ARGV[3] wants, ARGV[4] cap, ARGV[5] block
-- (spare slots at most), ARGV[6] lease (ms), ARGV[7] deadline (µs on
-- Redis's clock; 0: none).
--
-- Reply: {allowed, busy (1 when some demand is not met, else 0), now_us}:
-- granted; or {-1, 0, now_us}: past the deadline, nothing done.
-- Records the holder's field as {max(allowed, floor), wants, expiry, short
-- since} (none when the first two are 0). Running it twice answers the same.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deadline = tonumber(ARGV[7])
if deadline > 0 and now_us > deadline then
  return {-1, 0, now_us}
end
local now = math.floor(now_us / 1000)
local holder = ARGV[1]
local floor, wants = tonumber(ARGV[2]), tonumber(ARGV[3])
local cap, block, lease = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local fields = redis.call('HGETALL', KEYS[1])
-- Since when this holder has been short (its demand not met), if it was at
-- its last claim (µs: claims one after another get distinct times); one
-- that was not ranks after every one that was.
local since = now_us + 1
local others_has, short = 0, 0
local claimants = {}
for i = 1, #fields, 2 do
  local h, v = fields[i], fields[i + 1]
  local has, want, expires, was = string.match(v, '^(%d+) (%d+) (%d+) ?(%d*)$')
  was = tonumber(was) or 0
  if not has or tonumber(expires) <= now then
    redis.call('HDEL', KEYS[1], h)
  elseif h == holder then
    if was > 0 then since = was end
  else
    has, want = tonumber(has), tonumber(want)
    others_has = others_has + has
    if want > has then short = short + want - has end
    if was == 0 then was = now_us + 1 end
    claimants[#claimants + 1] = {want, was, h}
  end
end
claimants[#claimants + 1] = {wants, since, holder}
local total = 0
for _, c in ipairs(claimants) do total = total + c[1] end
local free = cap - others_has
local allowed, busy
-- Given an odd slot (above `level`): to the back of the queue for the next.
local odd, level = false, nil
if short == 0 and total <= cap and wants <= free then
  busy = 0
  allowed = wants + math.min(block, math.floor(math.max(free - wants, 0) / 2))
else
  -- Water-filling: demands below an even split of what is left are met;
  -- the others get the split rounded down, and the slots left over go one
  -- each to those short the longest (so an odd slot turns round, and a
  -- cap smaller than the claimants still serves them in turn).
  busy = 1
  allowed = wants
  table.sort(claimants, function(a, b) return a[1] < b[1] end)
  local left = cap
  for i, c in ipairs(claimants) do
    local n = #claimants - i + 1
    if c[1] * n > left then
      level = math.floor(left / n)
      if wants > level then
        local ahead = 0
        for j = i, #claimants do
          local o = claimants[j]
          if o[3] ~= holder and (o[2] < since or (o[2] == since and o[3] < holder)) then
            ahead = ahead + 1
          end
        end
        odd = ahead < left - level * n
        allowed = level + (odd and 1 or 0)
      end
      break
    end
    left = left - c[1]
  end
end
allowed = math.max(0, math.min(allowed, free))
odd = odd and allowed > level
local has = math.max(allowed, floor)
if has == 0 and wants == 0 then
  redis.call('HDEL', KEYS[1], holder)
else
  local was = 0
  if allowed < wants then was = odd and now_us or math.min(since, now_us) end
  -- %d: µs have 16 digits, past what `..` prints without an exponent.
  local field = string.format('%d %d %d %d', has, wants, now + lease, was)
  redis.call('HSET', KEYS[1], holder, field)
  redis.call('PEXPIRE', KEYS[1], lease * 2)
end
return {allowed, busy, now_us}
