-- NODE_TIME: the `TIME` of the node that runs it, sent to a chosen master
-- of a Redis Cluster by a key of its slots (the key itself is never read).
-- Reply: {seconds, microseconds}, as `TIME` answers.
return redis.call('TIME')
