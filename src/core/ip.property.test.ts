import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { checkIpAllowlist, compileAllowlist, ipInRange, parseCidr, parseIp, validateAllowlist } from './ip.js'

const RUNS = { numRuns: 500 }

const anyText = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 80 }),
  fc.string({ unit: fc.constantFrom('0', '1', '9', 'f', 'F', ':', '.', '/', '%', '[', ']', ' ', 'x', '2', '5'), maxLength: 50 }),
  fc.ipV4(),
  fc.ipV6(),
  fc.tuple(fc.oneof(fc.ipV4(), fc.ipV6()), fc.string({ maxLength: 5 })).map(([a, p]) => `${a}/${p}`),
)

const V4_MAX = 0xffffffffn
const V6_MAX = (1n << 128n) - 1n

function formatV4(n: bigint): string {
  return [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 0xffn)).join('.')
}

/** Full, uncompressed form; or the compressed form a URL parser writes. */
function formatV6(n: bigint, compressed: boolean): string {
  const groups = [112n, 96n, 80n, 64n, 48n, 32n, 16n, 0n].map((s) => ((n >> s) & 0xffffn).toString(16))
  const full = groups.join(':')
  return compressed ? new URL(`http://[${full}]/`).hostname.slice(1, -1) : full
}

function maskOf(bits: number, width: number): bigint {
  const all = (1n << BigInt(width)) - 1n
  return bits === 0 ? 0n : (all >> BigInt(width - bits)) << BigInt(width - bits)
}

/** A range, an address inside it and one outside it (when the range is not everything). */
function rangeCase(width: 32 | 128) {
  const max = width === 32 ? V4_MAX : V6_MAX
  return fc
    .record({
      base: fc.bigInt(0n, max),
      bits: fc.integer({ min: 0, max: width }),
      host: fc.bigInt(0n, max),
      flip: fc.nat(width - 1),
    })
    .map(({ base, bits, host, flip }) => {
      const mask = maskOf(bits, width)
      const network = base & mask
      const inside = network | (host & ~mask & max)
      // Flip one bit inside the prefix: the address leaves the range.
      const outside = bits === 0 ? null : inside ^ (1n << BigInt(width - 1 - (flip % bits)))
      return { network, bits, inside, outside }
    })
}

describe('IP addresses and CIDR entries, property-based', () => {
  it('arbitrary strings never throw', () => {
    const list = compileAllowlist(['10.0.0.0/8', '2001:db8::/32'])
    fc.assert(
      fc.property(anyText, (text) => {
        const words = parseIp(text)
        if (words) for (const w of words) expect(w >>> 0).toBe(w)
        const range = parseCidr(text)
        if (typeof range !== 'string') expect(range.bits).toBeGreaterThanOrEqual(0)
        const invalid = validateAllowlist([text])
        // validateAllowlist is parseCidr without its leniencies: no spaces around, no zone index,
        // no brackets.
        expect(invalid === null).toBe(typeof range !== 'string' && text.trim() === text && !/[%[\]]/.test(text))
        expect(typeof checkIpAllowlist(text, list)).toBe('boolean')
        expect(checkIpAllowlist(text, null)).toBe(true)
        if (!words) expect(checkIpAllowlist(text, list)).toBe(false)
      }),
      RUNS,
    )
  })

  it('every IPv4 address parses, and its IPv4-mapped IPv6 spelling is the same address', () => {
    fc.assert(
      fc.property(fc.ipV4(), (address) => {
        const words = parseIp(address)
        expect(words).not.toBeNull()
        expect(parseIp(`::ffff:${address}`)).toEqual(words)
        expect(parseIp(`[::ffff:${address}]`)).toEqual(words)
      }),
      RUNS,
    )
  })

  it('every IPv6 address parses, and its compressed form is the same address', () => {
    fc.assert(
      fc.property(fc.ipV6(), (address) => {
        const words = parseIp(address)
        expect(words, address).not.toBeNull()
        const compressed = new URL(`http://[${address}]/`).hostname.slice(1, -1)
        expect(parseIp(compressed)).toEqual(words)
        expect(parseIp(address.toUpperCase())).toEqual(words)
      }),
      RUNS,
    )
  })

  it('IPv4 ranges: every address inside matches, an address outside does not', () => {
    fc.assert(
      fc.property(rangeCase(32), ({ network, bits, inside, outside }) => {
        const entry = `${formatV4(network)}/${bits}`
        const range = parseCidr(entry)
        if (typeof range === 'string') throw new Error(`${entry} refused: ${range}`)
        expect(ipInRange(parseIp(formatV4(inside))!, range)).toBe(true)
        expect(checkIpAllowlist(`::ffff:${formatV4(inside)}`, [range])).toBe(true)
        if (outside !== null) expect(checkIpAllowlist(formatV4(outside), [range])).toBe(false)
        // An IPv4 range never matches a native IPv6 address.
        expect(checkIpAllowlist('2001:db8::1', [range])).toBe(false)
      }),
      RUNS,
    )
  })

  it('IPv6 ranges: every address inside matches, an address outside does not', () => {
    fc.assert(
      fc.property(rangeCase(128), fc.boolean(), ({ network, bits, inside, outside }, compressed) => {
        const entry = `${formatV6(network, compressed)}/${bits}`
        const range = parseCidr(entry)
        if (typeof range === 'string') throw new Error(`${entry} refused: ${range}`)
        expect(range.bits).toBe(bits)
        expect(checkIpAllowlist(formatV6(inside, !compressed), [range])).toBe(true)
        if (outside !== null) expect(checkIpAllowlist(formatV6(outside, compressed), [range])).toBe(false)
      }),
      RUNS,
    )
  })

  it('an entry with host bits set is refused, never widened or narrowed', () => {
    fc.assert(
      fc.property(rangeCase(32), fc.nat(31), ({ network, bits }, hostBit) => {
        fc.pre(bits < 32)
        const bit = 1n << BigInt(hostBit % (32 - bits))
        expect(parseCidr(`${formatV4(network | bit)}/${bits}`)).toBe('host-bits')
      }),
      RUNS,
    )
  })

  it('prefix lengths beyond the address width are refused', () => {
    fc.assert(
      fc.property(fc.ipV4(), fc.integer({ min: 33, max: 999 }), (address, bits) => {
        expect(parseCidr(`${address}/${bits}`)).toBe('prefix')
      }),
      { numRuns: 200 },
    )
  })
})
