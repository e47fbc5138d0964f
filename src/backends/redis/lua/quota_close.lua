-- QUOTA_CLOSE: one replica heard an upstream say its quota is spent.
-- KEYS[1]: the board (a hash: host -> Redis time, ms, when its gate opens).
-- ARGV[1]: the host; ARGV[2]: how long its gate stays closed, ms.
-- A later opening wins; the hash lives a day past its last closing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local untl = now + tonumber(ARGV[2])
local old = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if untl > old then
  redis.call('HSET', KEYS[1], ARGV[1], untl)
end
redis.call('PEXPIRE', KEYS[1], 86400000 + tonumber(ARGV[2]))
return 1
