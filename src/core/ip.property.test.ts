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

  it('prefix lengths beyond the address width are refused: IPv4 past /32, IPv6 (IPv4-mapped too) past /128', () => {
    // The width is the entry's own family, not the 128-bit space both are compared in: an IPv4
    // /33 is no /129, and an IPv6 /129 would be a range past the last bit.
    const beyond = fc.oneof(
      fc.tuple(fc.ipV4(), fc.integer({ min: 33, max: 999 })),
      fc.tuple(fc.ipV6(), fc.integer({ min: 129, max: 999 })),
      fc.tuple(fc.ipV4().map((a) => `::ffff:${a}`), fc.integer({ min: 129, max: 999 })),
    )
    fc.assert(
      fc.property(beyond, ([address, bits]) => {
        expect(parseCidr(`${address}/${bits}`)).toBe('prefix')
        expect(validateAllowlist([`${address}/${bits}`])?.message).toMatch(/has an invalid prefix length$/)
        expect(() => compileAllowlist([`${address}/${bits}`])).toThrow(RangeError)
      }),
      { numRuns: 300 },
    )
    // The widths themselves are ranges (a single address).
    for (const [entry, bits] of [['192.0.2.1/32', 128], ['2001:db8::1/128', 128], ['::ffff:192.0.2.1/128', 128], ['::/0', 0], ['0.0.0.0/0', 96]] as const) {
      expect(parseCidr(entry), entry).toMatchObject({ bits })
    }
  })
})

// --- Allowlists of several entries -------------------------------------------------------

/** IPv4 addresses are compared as their IPv4-mapped IPv6 form, `::ffff:a.b.c.d` (ip.ts). */
const MAPPED = 0xffffn << 32n

/** An allowlist entry as written, and the range it covers in the 128-bit space. */
interface Entry {
  text: string
  network: bigint
  bits: number
}

/** A client address as the adapter would pass it, and its value in the 128-bit space. */
interface Client {
  text: string
  value: bigint
}

const v4Client = (n: bigint, mapped: boolean): Client => ({ text: mapped ? `::ffff:${formatV4(n)}` : formatV4(n), value: MAPPED | n })
const v6Client = (n: bigint, compressed: boolean): Client => ({ text: formatV6(n, compressed), value: n })

/**
 * An entry of any family, written as a user would (IPv4, IPv6 full or compressed, an IPv4
 * range in its IPv4-mapped IPv6 spelling, a bare address for a /32 or /128), with a client
 * inside it and one just outside it (one bit of the prefix flipped), written either way.
 */
const entryWithClients: fc.Arbitrary<{ entry: Entry; clients: Client[] }> = fc.oneof(
  fc.tuple(rangeCase(32), fc.boolean(), fc.boolean()).map(([{ network, bits, inside, outside }, bare, mapped]) => ({
    entry: { text: bits === 32 && bare ? formatV4(network) : `${formatV4(network)}/${bits}`, network: MAPPED | network, bits: 96 + bits },
    clients: [v4Client(inside, mapped), ...(outside === null ? [] : [v4Client(outside, !mapped)])],
  })),
  fc.tuple(rangeCase(32), fc.boolean()).map(([{ network, bits, inside, outside }, mapped]) => ({
    entry: { text: `::ffff:${formatV4(network)}/${96 + bits}`, network: MAPPED | network, bits: 96 + bits },
    clients: [v4Client(inside, mapped), ...(outside === null ? [] : [v4Client(outside, mapped)])],
  })),
  fc.tuple(rangeCase(128), fc.boolean()).map(([{ network, bits, inside, outside }, compressed]) => ({
    entry: { text: bits === 128 && compressed ? formatV6(network, true) : `${formatV6(network, compressed)}/${bits}`, network, bits },
    clients: [v6Client(inside, !compressed), ...(outside === null ? [] : [v6Client(outside, compressed)])],
  })),
)

/** Anyone else: any IPv4 address (either spelling) or IPv6 address. */
const stranger: fc.Arbitrary<Client> = fc.oneof(
  fc.tuple(fc.bigInt(0n, V4_MAX), fc.boolean()).map(([n, mapped]) => v4Client(n, mapped)),
  fc.tuple(fc.bigInt(0n, V6_MAX), fc.boolean()).map(([n, compressed]) => v6Client(n, compressed)),
)

/** The reference: a client is allowed when its value shares the first `bits` bits of some entry's network. */
function allowedByModel(entries: readonly Entry[], value: bigint): boolean {
  return entries.some(({ network, bits }) => value >> BigInt(128 - bits) === network >> BigInt(128 - bits))
}

describe('allowlists of several entries, IPv4 and IPv6 mixed, property-based', () => {
  it('a client is allowed exactly when it lies in any one of the entries, whatever their order', () => {
    fc.assert(
      fc.property(fc.array(entryWithClients, { minLength: 1, maxLength: 6 }), fc.array(stranger, { maxLength: 4 }), (cases, strangers) => {
        const entries = cases.map((c) => c.entry)
        const texts = entries.map((e) => e.text)
        // What a user types is what the token service takes.
        expect(validateAllowlist(texts)).toBeNull()
        const lists = [compileAllowlist(texts), compileAllowlist([...texts].reverse())]
        // Each entry's inside client (allowed), its outside one (allowed only when another entry
        // covers it) and strangers, in turn, so a client's answer cannot come from the one before.
        for (const client of [...cases.flatMap((c) => c.clients), ...strangers]) {
          const want = allowedByModel(entries, client.value)
          for (const list of lists) expect(checkIpAllowlist(client.text, list), `${client.text} against ${texts.join(', ')}`).toBe(want)
        }
        // Every entry admits its inside client, wherever it stands in the list.
        for (const c of cases) expect(checkIpAllowlist(c.clients[0]!.text, lists[0]!)).toBe(true)
      }),
      RUNS,
    )
  })

  it('an address outside every entry is refused, one inside the last entry only is allowed', () => {
    // Disjoint entries by construction: distinct /24s of 10/8 and /48s of 2001:db8::/32.
    fc.assert(
      fc.property(
        fc.uniqueArray(fc.nat(0xffff), { minLength: 2, maxLength: 8 }),
        fc.array(fc.boolean(), { minLength: 8, maxLength: 8 }),
        fc.nat(255),
        (nets, families, host) => {
          const texts = nets.map((n, i) => (families[i] ? `10.${n >> 8}.${n & 0xff}.0/24` : `2001:db8:${n.toString(16)}::/48`))
          const list = compileAllowlist(texts)
          const last = nets.length - 1
          const n = nets[last]!
          const inLast = families[last] ? `10.${n >> 8}.${n & 0xff}.${host}` : `2001:db8:${n.toString(16)}::${host.toString(16)}`
          expect(checkIpAllowlist(inLast, list)).toBe(true)
          // A /24 and a /48 no entry names.
          let unused = 0
          while (nets.includes(unused)) unused++
          expect(checkIpAllowlist(`10.${unused >> 8}.${unused & 0xff}.${host}`, list)).toBe(false)
          expect(checkIpAllowlist(`2001:db8:${unused.toString(16)}::${host.toString(16)}`, list)).toBe(false)
        },
      ),
      { numRuns: 200 },
    )
  })
})
