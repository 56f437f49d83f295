/**
 * Two platform instances behind one load balancer, sharing Redis (DESIGN.md "Versions",
 * "API tokens", "Stores"), each served over real HTTP on 127.0.0.1 through the web adapter,
 * driven with the official MCP SDK client:
 *
 * - a session opened on instance A and continued on instance B keeps its pinned version after
 *   a deploy (session pins in Redis), and the instance holding its GET stream keeps the pin
 *   alive for the others past the idle TTL (on real time: Redis expires keys on its own clock);
 * - a token revoked or rotated through A's token service is refused by B as soon as the
 *   invalidation arrives, although B caches token records for a minute (Redis pub/sub);
 * - the rate-limit budget is one, whichever instance counts (counters in Redis);
 * - an OAuth token validated on one instance is a cache hit on the other (validation cache).
 *
 * What Redis does not hold is shared as the platform would share it: one App store (the
 * platform's database), one token store object (standing in for the shared PostgreSQL), and
 * one set of App servers per version (the Apps' own services). Each instance has its own
 * Redis connection, stores, token service (with its own cache) and invalidation bus.
 */
import { describeRedis } from '../helpers/redis.js'
import { sharedValidationCacheSuite, twoInstancesSuite } from './redis-instances-suite.js'

describeRedis('two instances sharing Redis, through the real pipeline and the MCP SDK client', (redis) =>
  twoInstancesSuite(redis, { keepAlive: true }),
)
describeRedis('the OAuth validation cache, shared by two instances through Redis', sharedValidationCacheSuite)
