-- QUOTA_READ: the upstreams whose gates are closed now, for every replica.
-- KEYS[1]: the board (a hash: host -> Redis time, ms, when its gate opens).
-- Reply: {host, ms it stays closed, host, ms, ...}; opened gates are removed.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local out = {}
for i = 1, #all, 2 do
  local left = tonumber(all[i + 1]) - now
  if left > 0 then
    out[#out + 1] = all[i]
    out[#out + 1] = left
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return out
