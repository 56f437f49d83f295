/**
 * Client address resolution (DESIGN.md "Adapters"): the socket address unless the platform
 * configures trusted proxies; `X-Forwarded-For` is never trusted by default.
 * @module
 */
import { type IpRange, type IpWords, compileAllowlist, ipInRange, parseIp } from './ip.js'

/**
 * Which proxies may set `X-Forwarded-For`:
 * - `false` (default): ignore the header, use the socket address.
 * - a number `n`: trust the last `n` hops (the socket peer and the `n - 1` proxies before it).
 * - a list of addresses / CIDR ranges: walk the chain from the right while the hop is trusted.
 */
export type TrustProxy = false | number | readonly string[]

/** A compiled {@link TrustProxy}. */
export type CompiledTrustProxy = false | number | readonly IpRange[]

/**
 * Compiles a {@link TrustProxy} setting once, for {@link resolveClientAddress}.
 *
 * @throws {TypeError} for a setting that is none of the three forms (`true` among them: it
 * would let any client choose its address), a list with an entry that is no address or range,
 * or ranges that alone or together trust every IPv4 peer, or every global IPv6 peer
 * (`2000::/3`), as `true` would (`0.0.0.0/0`, `::/0`, `0.0.0.0/1` with `128.0.0.0/1`, an IPv6
 * range holding `::ffff:0:0/96`, the block IPv4 peers are matched in).
 *
 * @example
 * ```ts
 * compileTrustProxy(undefined)      // false: X-Forwarded-For ignored
 * compileTrustProxy(1)              // 1: the socket peer is the one trusted proxy
 * compileTrustProxy(['10.0.0.0/8']) // [{ words: [0, 0, 65535, 167772160], bits: 104 }]
 * compileTrustProxy(['0.0.0.0/0'])
 * // throws TypeError: trustProxy: entry 0 ("0.0.0.0/0") trusts every IPv4 peer, so any client could choose its address: …
 * ```
 */
export function compileTrustProxy(trust: TrustProxy | undefined): CompiledTrustProxy {
  if (trust === undefined || trust === false) return false
  if (typeof trust === 'number') {
    if (!Number.isSafeInteger(trust) || trust < 0) throw new TypeError('trustProxy must be a hop count >= 0')
    return trust === 0 ? false : trust
  }
  if (!Array.isArray(trust)) {
    // `true` (Express's "trust every proxy") would let any client set its own address.
    throw new TypeError('trustProxy must be false, a hop count, or a list of the proxies\' addresses or CIDR ranges')
  }
  let ranges: readonly IpRange[]
  try {
    ranges = compileAllowlist(trust) ?? []
  } catch (error) {
    throw new TypeError(`trustProxy: ${(error as Error).message}`)
  }
  // Ranges that trust every peer of a family, alone or together, are `true` in other words:
  // any client could choose its address.
  for (const [family, block] of EVERY_PEER) {
    const covering = coveringEntries(ranges, block)
    if (covering !== null) {
      throw new TypeError(
        `trustProxy: ${covering.map((i) => `entry ${i} (${JSON.stringify(trust[i])})`).join(', ')} ${covering.length === 1 ? 'trusts' : 'together trust'} every ${family} peer, so any client could choose its address: list your proxies' ranges, or give a hop count`,
      )
    }
  }
  return ranges
}

/**
 * Blocks of peers no trust list may cover whole: IPv4 (matched as IPv4-mapped IPv6,
 * `::ffff:0:0/96`: `0.0.0.0/0`, `::/0`, and an IPv6 range holding that block cover it) and the
 * global IPv6 unicast addresses (`2000::/3`).
 */
const EVERY_PEER: ReadonlyArray<readonly [string, Interval]> = [
  ['IPv4', intervalOf([0, 0, 0xffff, 0], 96)],
  ['global IPv6', intervalOf([0x20000000, 0, 0, 0], 3)],
]

/** First and last address of a range, as 128-bit integers. */
type Interval = readonly [bigint, bigint]

function intervalOf(words: IpWords, bits: number): Interval {
  let first = 0n
  for (const word of words) first = (first << 32n) | BigInt(word >>> 0)
  return [first, first | ((1n << BigInt(128 - bits)) - 1n)]
}

/**
 * The index of a range that covers `block` whole alone, else the indexes of the ranges that
 * meet it when together they cover it, else `null`.
 */
function coveringEntries(ranges: readonly IpRange[], block: Interval): number[] | null {
  const [start, end] = block
  const spans = ranges.map((range, index) => ({ index, span: intervalOf(range.words, range.bits) }))
  const alone = spans.find(({ span }) => span[0] <= start && span[1] >= end)
  if (alone !== undefined) return [alone.index]
  const meeting = spans
    .filter(({ span }) => span[0] <= end && span[1] >= start)
    .sort((a, b) => (a.span[0] < b.span[0] ? -1 : a.span[0] > b.span[0] ? 1 : 0))
  let next = start
  for (const { span } of meeting) {
    if (span[0] > next) return null
    if (span[1] >= next) next = span[1] + 1n
    if (next > end) return meeting.map(({ index }) => index).sort((a, b) => a - b)
  }
  return null
}

/**
 * The client address of a request, as the adapters resolve it: `socketAddress` (the TCP
 * peer) unless `trust` lets the proxies of `forwardedFor` (the raw `X-Forwarded-For` value,
 * hops separated by commas, a port on a hop dropped) name another. With a hop count `n`, the
 * hop `n` places left of the socket peer (the leftmost when the chain is shorter); with a list,
 * the rightmost hop that is not a trusted proxy. `undefined` only when `socketAddress` is, or
 * is `null` or `''` (a request with no known peer). For code that answers requests without an adapter, such as a
 * token API on a Web-standard runtime behind a proxy.
 *
 * @example
 * ```ts
 * resolveClientAddress('10.0.0.2', '203.0.113.9, 10.0.0.1', compileTrustProxy(['10.0.0.0/8'])) // '203.0.113.9'
 * resolveClientAddress('10.0.0.2', '203.0.113.9', false) // '10.0.0.2'
 * ```
 */
export function resolveClientAddress(
  socketAddress: string | null | undefined,
  forwardedFor: string | null | undefined,
  trust: CompiledTrustProxy,
): string | undefined {
  // No known peer (`null` and `''` from a platform's JavaScript count as none): the header
  // cannot be judged, and is ignored.
  if (!socketAddress) return undefined
  if (trust === false || !forwardedFor) return socketAddress
  // The chain is read from the right, as far as the trust reaches, and no further: a header of
  // 16,000 commas, which any client can send through a proxy that appends to it, cost a
  // millisecond of CPU split whole (a denial-of-service audit).
  let end = forwardedFor.length
  const hopBefore = (): string | undefined => {
    while (end > 0) {
      const comma = forwardedFor.lastIndexOf(',', end - 1)
      const hop = stripPort(forwardedFor.slice(comma + 1, end))
      end = comma
      if (hop.length > 0) return hop
    }
    return undefined
  }
  let address = socketAddress
  if (typeof trust === 'number') {
    for (let hops = 0; hops < trust; hops++) {
      const before = hopBefore()
      if (before === undefined) break
      address = before
    }
    return address
  }
  while (isTrusted(address, trust)) {
    const before = hopBefore()
    if (before === undefined) break
    address = before
  }
  return address
}

/** Whether `address` is in one of the trusted proxies' ranges. */
function isTrusted(address: string, trust: readonly IpRange[]): boolean {
  const words = parseIp(address)
  return words !== null && trust.some((range) => ipInRange(words, range))
}

/** `v4:port` and `[v6]:port`, as some proxies write hops in `X-Forwarded-For`, lose the port. */
function stripPort(hop: string): string {
  const text = hop.trim()
  const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(text)
  if (bracketed) return bracketed[1]!
  return /^[\d.]+:\d{1,5}$/.test(text) ? text.slice(0, text.indexOf(':')) : text
}

/**
 * The scheme a trusted proxy says the client used: the first value of `X-Forwarded-Proto`, as
 * Express reads it (Fastify's `request.protocol` takes the last of a list), or `undefined` to
 * keep the request's own. The header counts only when the socket peer is a trusted proxy
 * (`trust` a hop count, or a list holding the peer's address; never without a known peer), and
 * only `http` or `https` (any case) is taken: another value names no scheme an App address can
 * have, and is ignored.
 *
 * @example
 * ```ts
 * forwardedProtocol('10.0.0.2', 'https', compileTrustProxy(['10.0.0.0/8'])) // 'https'
 * forwardedProtocol('203.0.113.9', 'https', compileTrustProxy(['10.0.0.0/8'])) // undefined
 * ```
 */
export function forwardedProtocol(
  socketAddress: string | null | undefined,
  forwardedProto: string | null | undefined,
  trust: CompiledTrustProxy,
): 'http' | 'https' | undefined {
  if (trust === false || !forwardedProto || !socketAddress) return undefined
  if (typeof trust !== 'number' && !isTrusted(socketAddress, trust)) return undefined
  const comma = forwardedProto.indexOf(',')
  return schemeOf(comma === -1 ? forwardedProto : forwardedProto.slice(0, comma))
}

/** `http` or `https` for those names in any case, around optional whitespace; else `undefined`. */
export function schemeOf(value: string): 'http' | 'https' | undefined {
  const name = value.trim().toLowerCase()
  return name === 'http' || name === 'https' ? name : undefined
}
