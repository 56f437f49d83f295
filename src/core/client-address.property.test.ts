import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { type CompiledTrustProxy, compileTrustProxy, resolveClientAddress } from './client-address.js'
import { ipInRange, parseCidr, parseIp } from './ip.js'

const RUNS = { numRuns: 500 }

const address = fc.oneof(fc.ipV4(), fc.ipV6())
/**
 * What proxies and clients put in `X-Forwarded-For`, each hop with the address the resolver
 * must read from it (`null`: an empty entry, skipped). Known by construction, so the test does
 * not parse the header itself.
 */
interface Hop {
  readonly text: string
  readonly reads: string | null
}
const hop: fc.Arbitrary<Hop> = fc.oneof(
  { weight: 4, arbitrary: address.map((a) => ({ text: a, reads: a })) },
  fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 65535 })).map(([a, p]) => ({ text: `${a}:${p}`, reads: a })),
  fc.tuple(fc.ipV6(), fc.integer({ min: 0, max: 65535 })).map(([a, p]) => ({ text: `[${a}]:${p}`, reads: a })),
  fc.ipV6().map((a) => ({ text: ` [${a}] `, reads: a })),
  address.map((a) => ({ text: `  ${a} `, reads: a })),
  fc.constantFrom({ text: '', reads: null }, { text: '  ', reads: null }),
  // Garbage that is no address and has no port, bracket, comma or space: read as it is.
  fc.string({ unit: fc.constantFrom('u', 'n', 'k', 'x', '-', '_', 'z'), minLength: 1, maxLength: 10 }).map((t) => ({ text: t, reads: t })),
)
const hops = fc.array(hop, { maxLength: 6 })
const headerOf = (list: readonly Hop[]) => list.map((h) => h.text).join(',')
/** The chain the resolver walks: the hops it reads, then the socket peer. */
const chainOf = (list: readonly Hop[], socket: string) => [...list.flatMap((h) => (h.reads === null ? [] : [h.reads])), socket]

/** The network address of `address/bits` (a range whose host bits are set is refused). */
function v4Network(address: string, bits: number): string {
  const n = address.split('.').reduce((acc, part) => acc * 256 + Number(part), 0)
  const network = bits === 0 ? 0 : n - (n % 2 ** (32 - bits))
  return [24, 16, 8, 0].map((shift) => Math.floor(network / 2 ** shift) % 256).join('.')
}

/**
 * Trusted ranges drawn near the addresses the tests use, so that some hops are trusted. Wide
 * ones too, though none that alone or together cover every IPv4 or global IPv6 peer, which
 * `compileTrustProxy` refuses: IPv4 ranges of /3 or longer, at most four, beside one IPv4 /1.
 */
const trustList = fc.array(
  fc.oneof(
    address,
    fc.tuple(fc.ipV4(), fc.integer({ min: 3, max: 32 })).map(([a, bits]) => `${v4Network(a, bits)}/${bits}`),
    fc.ipV6().map((a) => `${a}/128`),
    fc.constantFrom('10.0.0.0/8', '127.0.0.1', '::1', '0.0.0.0/1', '8000::/1', 'fe80::/10', '2001:db8::/32'),
  ),
  { maxLength: 4 },
)
const anyTrust: fc.Arbitrary<CompiledTrustProxy> = fc.oneof(
  fc.constant(false as const),
  fc.integer({ min: 0, max: 8 }).map(compileTrustProxy),
  trustList.map(compileTrustProxy),
)

function trusted(hopAddress: string, ranges: Exclude<CompiledTrustProxy, false | number>): boolean {
  const words = parseIp(hopAddress)
  return words !== null && ranges.some((range) => ipInRange(words, range))
}

/** Any header at all: the hops above joined, or arbitrary text. */
const anyHeader = fc.oneof(hops.map(headerOf), fc.string({ unit: 'binary', maxLength: 80 }))

describe('client address, property-based', () => {
  it('never throws, and answers the socket address or a piece of the header', () => {
    fc.assert(
      fc.property(fc.option(address, { nil: undefined }), fc.option(anyHeader, { nil: undefined }), anyTrust, (socket, header, trust) => {
        const client = resolveClientAddress(socket, header, trust)
        if (socket === undefined) expect(client).toBeUndefined()
        else if (client !== socket) expect((header ?? '').includes(client!)).toBe(true)
      }),
      RUNS,
    )
  })

  it('X-Forwarded-For is ignored unless proxies are trusted (DESIGN.md): the socket address, whatever the header', () => {
    fc.assert(
      fc.property(address, anyHeader, (socket, header) => {
        expect(resolveClientAddress(socket, header, compileTrustProxy(undefined))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy(false))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy(0))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy([]))).toBe(socket)
      }),
      RUNS,
    )
  })

  it('a hop count n picks the entry n places left of the socket peer, or the leftmost (spaces, ports and empty entries dropped)', () => {
    fc.assert(
      fc.property(address, hops, fc.integer({ min: 1, max: 8 }), (socket, list, n) => {
        const chain = chainOf(list, socket)
        expect(resolveClientAddress(socket, headerOf(list), compileTrustProxy(n))).toBe(chain[Math.max(0, chain.length - 1 - n)])
      }),
      RUNS,
    )
  })

  it('a client cannot move the answer by prepending entries: with a hop count, only the rightmost n entries matter', () => {
    fc.assert(
      fc.property(address, fc.array(address, { minLength: 3, maxLength: 6 }), hops, (socket, honest, forged) => {
        const n = honest.length
        const answer = resolveClientAddress(socket, honest.join(','), compileTrustProxy(n))
        expect(answer).toBe(honest[0])
        expect(resolveClientAddress(socket, [headerOf(forged), ...honest].join(','), compileTrustProxy(n))).toBe(answer)
      }),
      RUNS,
    )
  })

  it('with trusted proxies: an untrusted peer is the client; otherwise the answer is the rightmost untrusted hop, or the leftmost when all are trusted', () => {
    fc.assert(
      fc.property(address, hops, trustList, (socket, list, entries) => {
        const trust = compileTrustProxy(entries)
        const client = resolveClientAddress(socket, headerOf(list), trust)
        if (trust === false) {
          expect(client).toBe(socket)
          return
        }
        const ranges = trust as Exclude<CompiledTrustProxy, false | number>
        const chain = chainOf(list, socket)
        let expected = chain[0]
        for (let i = chain.length - 1; i >= 0; i--) {
          if (!trusted(chain[i]!, ranges)) {
            expected = chain[i]
            break
          }
        }
        expect(client).toBe(expected)
        if (!trusted(socket, ranges)) expect(client).toBe(socket)
      }),
      RUNS,
    )
  })

  it('a hop written with a port gives the bare address', () => {
    fc.assert(
      fc.property(fc.ipV4(), fc.ipV6(), fc.integer({ min: 0, max: 65535 }), (v4, v6, port) => {
        const trust = compileTrustProxy(1)
        expect(resolveClientAddress('10.0.0.1', `${v4}:${port}`, trust)).toBe(v4)
        expect(resolveClientAddress('10.0.0.1', `[${v6}]:${port}`, trust)).toBe(v6)
        expect(resolveClientAddress('10.0.0.1', ` [${v6}] `, trust)).toBe(v6)
      }),
      RUNS,
    )
  })

  it('compileTrustProxy accepts hop counts and address lists, and refuses anything else with a TypeError', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.integer({ min: -1000, max: 1000 }),
          fc.double({ noNaN: false }),
          fc.array(fc.oneof(address, fc.string({ maxLength: 20 })), { maxLength: 4 }),
        ),
        (setting) => {
          let compiled: CompiledTrustProxy | undefined
          let error: unknown
          try {
            compiled = compileTrustProxy(setting)
          } catch (caught) {
            error = caught
          }
          if (typeof setting === 'number') {
            const valid = Number.isSafeInteger(setting) && setting >= 0
            if (!valid) expect(error).toBeInstanceOf(TypeError)
            else expect(compiled).toBe(setting === 0 ? false : setting)
            return
          }
          const valid = setting.every((entry) => parseIp(entry) !== null)
          if (valid) expect(error).toBeUndefined()
          // An entry that is neither an address nor a range is refused, never taken silently.
          if (setting.some((entry) => typeof parseCidr(entry) === 'string')) expect(error).toBeInstanceOf(TypeError)
          if (error !== undefined) expect(error).toBeInstanceOf(TypeError)
          if (error !== undefined) expect((error as Error).message).toMatch(/^trustProxy: /)
        },
      ),
      RUNS,
    )
  })
})
