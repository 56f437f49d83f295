/**
 * IP addresses, CIDR ranges and the API-token IP allowlist (spec 5.2, DESIGN.md).
 *
 * Every address is held as 128 bits (four 32-bit words). IPv4 addresses live in the
 * IPv4-mapped range `::ffff:0:0/96`, so `10.0.0.1`, `::ffff:10.0.0.1` and `::ffff:a00:1` are
 * the same address and an IPv4 range matches a client that a dual-stack socket reports as
 * IPv4-mapped IPv6. No I/O, no `node:net`: it runs on every runtime.
 * @module
 */
import { quoted } from './text.js'

/** An address as four big-endian 32-bit words. */
export type IpWords = readonly [number, number, number, number]

/** A parsed CIDR range (a single address is a /32 or /128 range). */
export interface IpRange {
  /** Network address, host bits zero. */
  readonly words: IpWords
  /** Prefix length over the 128-bit space (IPv4 /24 is 120). */
  readonly bits: number
}

/**
 * Dotted-quad IPv4 to one word: four decimal parts 0 to 255, no leading zeros, no sign, no
 * spaces. One pass without `split` or a RegExp: the allowlist check parses the client
 * address of every request.
 */
function parseIpv4Word(text: string): number | null {
  let word = 0
  let part = 0
  let digits = 0
  let dots = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 46 /* . */) {
      if (digits === 0 || ++dots > 3) return null
      word = word * 256 + part
      part = 0
      digits = 0
    } else if (c >= 48 && c <= 57) {
      if (digits > 0 && part === 0) return null // a leading zero: "01" (octal in some parsers)
      part = part * 10 + (c - 48)
      if (++digits > 3 || part > 255) return null
    } else {
      return null
    }
  }
  if (dots !== 3 || digits === 0) return null
  return (word * 256 + part) >>> 0
}

/**
 * Parses an IPv4 or IPv6 address (brackets and an IPv6 zone id are tolerated). IPv4 and
 * IPv4-mapped IPv6 give the same words. `null` when the text is not an address.
 *
 * @example
 * ```ts
 * parseIp('192.0.2.1')        // [0, 0, 65535, 3221225985]
 * parseIp('::ffff:192.0.2.1') // parseIp('192.0.2.1'): the same words
 * parseIp('[2001:db8::1]')    // [536939960, 0, 0, 1]
 * parseIp('192.0.2.256')      // null
 * ```
 */
export function parseIp(input: string): IpWords | null {
  if (typeof input !== 'string') return null
  let text = input.trim()
  if (text.length === 0 || text.length > 64) return null
  if (text.startsWith('[') && text.endsWith(']')) text = text.slice(1, -1)
  const zone = text.indexOf('%')
  if (zone !== -1) text = text.slice(0, zone)
  if (!text.includes(':')) {
    const v4 = parseIpv4Word(text)
    return v4 === null ? null : [0, 0, 0xffff, v4]
  }
  return parseIpv6(text)
}

function parseIpv6(text: string): IpWords | null {
  const halves = text.split('::')
  if (halves.length > 2) return null
  const groups: number[] = []
  const parseSide = (side: string, allowV4: boolean): number[] | null => {
    if (side === '') return []
    const out: number[] = []
    const pieces = side.split(':')
    for (let i = 0; i < pieces.length; i++) {
      const piece = pieces[i]!
      if (allowV4 && i === pieces.length - 1 && piece.includes('.')) {
        const v4 = parseIpv4Word(piece)
        if (v4 === null) return null
        out.push(v4 >>> 16, v4 & 0xffff)
      } else {
        if (!/^[0-9a-fA-F]{1,4}$/.test(piece)) return null
        out.push(parseInt(piece, 16))
      }
    }
    return out
  }
  if (halves.length === 2) {
    const head = parseSide(halves[0]!, false)
    const tail = parseSide(halves[1]!, true)
    if (!head || !tail || head.length + tail.length > 7) return null
    groups.push(...head, ...new Array<number>(8 - head.length - tail.length).fill(0), ...tail)
  } else {
    const all = parseSide(text, true)
    if (!all || all.length !== 8) return null
    groups.push(...all)
  }
  const w = (i: number) => ((groups[i]! << 16) | groups[i + 1]!) >>> 0
  return [w(0), w(2), w(4), w(6)]
}

function maskWord(bits: number, index: number): number {
  const b = Math.max(0, Math.min(32, bits - index * 32))
  return b === 0 ? 0 : (0xffffffff << (32 - b)) >>> 0
}

/** Why {@link parseCidr} refused an entry. */
export type CidrError = 'address' | 'prefix' | 'host-bits'

/**
 * Parses an allowlist entry: an address or a CIDR range (`192.0.2.0/24`, `2001:db8::/32`).
 * Host bits must be zero (`192.0.2.1/24` is refused, as Python's `ip_network` does), so a
 * typo never silently widens or narrows the range. Spaces around an address, and before a
 * range's `/`, are tolerated here, so an entry stored before {@link validateAllowlist} refused
 * them still matches (spaces after a prefix length never were: `10.0.0.0/8 ` is `'prefix'`);
 * {@link validateAllowlist} refuses them all.
 *
 * @example
 * ```ts
 * parseCidr('192.0.2.0/24')   // { words: [0, 0, 65535, 3221225984], bits: 120 } (IPv4 as ::ffff:0:0/96)
 * parseCidr('192.0.2.1/24')   // 'host-bits'
 * parseCidr('2001:db8::/129') // 'prefix'
 * parseCidr('example.com')    // 'address'
 * ```
 */
export function parseCidr(entry: string): IpRange | CidrError {
  const slash = entry.indexOf('/')
  const addressText = slash === -1 ? entry : entry.slice(0, slash)
  const words = parseIp(addressText)
  if (!words) return 'address'
  const v4 = !addressText.includes(':')
  const max = v4 ? 32 : 128
  let bits = max
  if (slash !== -1) {
    const prefixText = entry.slice(slash + 1)
    if (!/^(0|[1-9]\d{0,2})$/.test(prefixText)) return 'prefix'
    bits = Number(prefixText)
    if (bits > max) return 'prefix'
  }
  const total = v4 ? bits + 96 : bits
  for (let i = 0; i < 4; i++) if ((words[i]! & ~maskWord(total, i)) !== 0) return 'host-bits'
  return { words, bits: total }
}

/**
 * True when `address` lies in `range`. An IPv4 address and its IPv4-mapped IPv6 form
 * (`::ffff:10.1.2.3`) are the same address.
 *
 * @example
 * ```ts
 * const range = parseCidr('10.0.0.0/8') as IpRange
 * ipInRange(parseIp('10.1.2.3')!, range)        // true
 * ipInRange(parseIp('::ffff:10.1.2.3')!, range) // true
 * ipInRange(parseIp('11.0.0.1')!, range)        // false
 * ```
 */
export function ipInRange(address: IpWords, range: IpRange): boolean {
  for (let i = 0; i < 4; i++) {
    const mask = maskWord(range.bits, i)
    if (((address[i]! & mask) >>> 0) !== range.words[i]) return false
  }
  return true
}

/** A compiled allowlist; `null` means no allowlist (every address allowed). */
export type CompiledAllowlist = readonly IpRange[] | null

/**
 * Compiles allowlist entries, throwing a `RangeError` naming the first bad entry and its
 * index. Use {@link validateAllowlist} to get the error as a value.
 *
 * @example
 * ```ts
 * compileAllowlist(null)                           // null: every address allowed
 * compileAllowlist(['10.0.0.0/8', '192.0.2.1/24'])
 * // throws RangeError: entry 1 ("192.0.2.1/24") has host bits set after the prefix
 * ```
 */
export function compileAllowlist(entries: readonly string[] | null | undefined): CompiledAllowlist {
  if (entries == null) return null
  return entries.map((entry: unknown, index) => {
    // A list read from JSON or an environment variable may hold a number or null.
    if (typeof entry !== 'string') throw new RangeError(`entry ${index} is ${kindOf(entry)}, not an address or CIDR range`)
    const range = parseCidr(entry)
    if (typeof range === 'string') throw new RangeError(describeCidrError(entry, index, range))
    return range
  })
}

/**
 * Entries an allowlist holds at most (spec 2.1 sets none; a bound on what each request compares).
 * @internal
 */
export const MAX_ALLOWLIST_ENTRIES = 100
/** Characters an allowlist entry holds at most (the longest IPv6 CIDR range is 43). */
const MAX_ALLOWLIST_ENTRY_LENGTH = 64

/**
 * What is wrong with an allowlist, as the token service refuses it, or `null` when it is
 * acceptable: the list itself (`index: null`: empty, since `[]` would allow no address where
 * `null` means no allowlist; more than 100 entries), else its first bad entry (`index`: longer
 * than 64 characters, or no address or CIDR range). Stricter than {@link parseCidr}, for
 * entries a user types: spaces around or inside an entry and IPv6 zone indexes (`fe80::1%eth0`) are
 * refused, not dropped, so the entry stored is the entry matched. Takes any value, as a record
 * read from a seed or an import holds it: `null` or `undefined` is no allowlist (acceptable);
 * anything but an array of strings is refused, never thrown on.
 *
 * @example
 * ```ts
 * validateAllowlist(['10.0.0.0/8'])               // null
 * validateAllowlist([])
 * // { index: null, message: 'must name at least one address or CIDR range (null removes the allowlist)' }
 * validateAllowlist(['10.0.0.0/8', ' 192.0.2.7'])
 * // { index: 1, message: 'entry 1 (" 192.0.2.7") has spaces around it' }
 * ```
 */
export function validateAllowlist(entries: unknown): { index: number | null; message: string } | null {
  if (entries == null) return null
  if (!Array.isArray(entries)) return { index: null, message: 'must be an array of addresses or CIDR ranges, or null for no allowlist' }
  if (entries.length === 0) return { index: null, message: 'must name at least one address or CIDR range (null removes the allowlist)' }
  if (entries.length > MAX_ALLOWLIST_ENTRIES) return { index: null, message: `at most ${MAX_ALLOWLIST_ENTRIES} entries` }
  for (let index = 0; index < entries.length; index++) {
    const entry: unknown = entries[index]
    if (typeof entry !== 'string') return { index, message: `entry ${index} is ${kindOf(entry)}, not an address or CIDR range` }
    if (entry.length > MAX_ALLOWLIST_ENTRY_LENGTH) {
      return { index, message: `entry ${index} (${shown(entry)}) is longer than ${MAX_ALLOWLIST_ENTRY_LENGTH} characters` }
    }
    if (entry.trim() !== entry) return { index, message: `entry ${index} (${shown(entry)}) has spaces around it` }
    // `10.0.0.0 /8` is no CIDR range (Python's `ip_network` refuses it too); parseCidr reads it
    // (parseIp trims its address), and it was stored and shown as written.
    if (/\s/.test(entry)) return { index, message: `entry ${index} (${shown(entry)}) has a space inside it` }
    if (entry.includes('%')) {
      return { index, message: `entry ${index} (${shown(entry)}) has a zone index (%…), which an allowlist cannot use` }
    }
    // `[2001:db8::1]` is a URL's host, not an address: stored as written, it would be shown so.
    if (entry.includes('[') || entry.includes(']')) {
      return { index, message: `entry ${index} (${shown(entry)}) has brackets ([…]), which belong in URLs: give the address alone` }
    }
    const result = parseCidr(entry)
    if (typeof result === 'string') return { index, message: describeCidrError(entry, index, result) }
  }
  return null
}

/** What a value that is no string is, for a message: `null`, `an array`, `a number`, … */
function kindOf(value: unknown): string {
  if (value === null || value === undefined) return String(value)
  if (Array.isArray(value)) return 'an array'
  return typeof value === 'object' ? 'an object' : `a ${typeof value}`
}

function shown(entry: string): string {
  return quoted(entry, 60)
}

function describeCidrError(entry: string, index: number, error: CidrError): string {
  switch (error) {
    case 'address':
      return `entry ${index} (${shown(entry)}) is not an IPv4/IPv6 address or CIDR range`
    case 'prefix':
      return `entry ${index} (${shown(entry)}) has an invalid prefix length`
    case 'host-bits':
      return `entry ${index} (${shown(entry)}) has host bits set after the prefix`
  }
}

// The last address parsed by checkIpAllowlist, and its words (parsing is pure).
let lastAddress: string | undefined
let lastWords: IpWords | null = null

/**
 * The allowlist check of spec 5.2: `true` when there is no allowlist or `clientAddress` lies
 * in one of its ranges; `false` when the address is outside, unknown or unparsable (fail
 * closed).
 *
 * @example
 * ```ts
 * checkIpAllowlist('::ffff:10.1.2.3', compileAllowlist(['10.0.0.0/8'])) // true
 * ```
 */
export function checkIpAllowlist(clientAddress: string | undefined, allowlist: CompiledAllowlist): boolean {
  if (allowlist === null) return true
  // `null` or `''` too (a platform's JavaScript passing what a header lookup gave): no address.
  if (!clientAddress) return false
  // Requests of one connection carry the same address string: parsed once for them.
  let address: IpWords | null
  if (clientAddress === lastAddress) address = lastWords
  else {
    address = parseIp(clientAddress)
    lastAddress = clientAddress
    lastWords = address
  }
  if (!address) return false
  for (const range of allowlist) if (ipInRange(address, range)) return true
  return false
}
