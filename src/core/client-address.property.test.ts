import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { type CompiledTrustProxy, compileTrustProxy, resolveClientAddress } from './client-address.js'
import { ipInRange, parseIp } from './ip.js'

const RUNS = { numRuns: 500 }

const address = fc.oneof(fc.ipV4(), fc.ipV6())
/** What proxies and clients put in `X-Forwarded-For`: addresses, ports, spaces, garbage. */
const hop = fc.oneof(
  { weight: 4, arbitrary: address },
  fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 65535 })).map(([a, p]) => `${a}:${p}`),
  fc.tuple(fc.ipV6(), fc.integer({ min: 0, max: 65535 })).map(([a, p]) => `[${a}]:${p}`),
  address.map((a) => `  ${a} `),
  fc.constant(''),
  fc.constant('unknown'),
  fc.string({ unit: 'binary', maxLength: 20 }),
)
const forwardedFor = fc.oneof(
  fc.array(hop, { maxLength: 6 }).map((hops) => hops.join(',')),
  fc.string({ unit: 'binary', maxLength: 80 }),
)
/** The network address of `address/bits` (a range whose host bits are set is refused). */
function v4Network(address: string, bits: number): string {
  const n = address.split('.').reduce((acc, part) => acc * 256 + Number(part), 0)
  const network = bits === 0 ? 0 : n - (n % 2 ** (32 - bits))
  return [24, 16, 8, 0].map((shift) => Math.floor(network / 2 ** shift) % 256).join('.')
}

/** Trusted ranges drawn near the addresses the tests use, so that some hops are trusted. */
const trustList = fc.array(
  fc.oneof(
    address,
    fc.tuple(fc.ipV4(), fc.integer({ min: 0, max: 32 })).map(([a, bits]) => `${v4Network(a, bits)}/${bits}`),
    fc.ipV6().map((a) => `${a}/128`),
    fc.constantFrom('10.0.0.0/8', '127.0.0.1', '::1', '0.0.0.0/0', '::/0', 'fe80::/10', '2001:db8::/32'),
  ),
  { maxLength: 4 },
)
const anyTrust: fc.Arbitrary<CompiledTrustProxy> = fc.oneof(
  fc.constant(false as const),
  fc.integer({ min: 0, max: 8 }).map(compileTrustProxy),
  trustList.map(compileTrustProxy),
)

/** The hops as the resolver reads them: trimmed, ports dropped, empty ones left out. */
function hopsOf(header: string): string[] {
  return header
    .split(',')
    .map((h) => {
      const text = h.trim()
      const bracketed = /^\[([^\]]+)\](?::\d{1,5})?$/.exec(text)
      if (bracketed) return bracketed[1]!
      return /^[\d.]+:\d{1,5}$/.test(text) ? text.slice(0, text.indexOf(':')) : text
    })
    .filter((h) => h.length > 0)
}

function trusted(hopAddress: string, ranges: Exclude<CompiledTrustProxy, false | number>): boolean {
  const words = parseIp(hopAddress)
  return words !== null && ranges.some((range) => ipInRange(words, range))
}

describe('client address, property-based', () => {
  it('never throws, and answers the socket address or one of the hops', () => {
    fc.assert(
      fc.property(fc.option(address, { nil: undefined }), fc.option(forwardedFor, { nil: undefined }), anyTrust, (socket, header, trust) => {
        const client = resolveClientAddress(socket, header, trust)
        if (socket === undefined) expect(client).toBeUndefined()
        else expect([socket, ...hopsOf(header ?? '')]).toContain(client)
      }),
      RUNS,
    )
  })

  it('X-Forwarded-For is ignored unless proxies are trusted (DESIGN.md): the socket address, whatever the header', () => {
    fc.assert(
      fc.property(address, forwardedFor, (socket, header) => {
        expect(resolveClientAddress(socket, header, compileTrustProxy(undefined))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy(false))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy(0))).toBe(socket)
        expect(resolveClientAddress(socket, header, compileTrustProxy([]))).toBe(socket)
      }),
      RUNS,
    )
  })

  it('a hop count n picks the entry n places left of the socket peer, or the leftmost', () => {
    fc.assert(
      fc.property(address, fc.array(hop, { maxLength: 6 }), fc.integer({ min: 1, max: 8 }), (socket, hops, n) => {
        const header = hops.join(',')
        const chain = [...hopsOf(header), socket]
        expect(resolveClientAddress(socket, header, compileTrustProxy(n))).toBe(chain[Math.max(0, chain.length - 1 - n)])
      }),
      RUNS,
    )
  })

  it('a client cannot move the answer by prepending entries: with a hop count, only the rightmost n entries matter', () => {
    fc.assert(
      fc.property(address, fc.array(address, { minLength: 3, maxLength: 6 }), fc.array(hop, { maxLength: 4 }), (socket, hops, forged) => {
        const n = hops.length
        const honest = resolveClientAddress(socket, hops.join(','), compileTrustProxy(n))
        const withForged = resolveClientAddress(socket, [...forged, ...hops].join(','), compileTrustProxy(n))
        expect(withForged).toBe(honest)
        expect(honest).toBe(hops[0])
      }),
      RUNS,
    )
  })

  it('with trusted proxies: an untrusted peer is the client; otherwise every hop right of the answer is trusted and the answer is not, unless it is the leftmost', () => {
    fc.assert(
      fc.property(address, forwardedFor, trustList, (socket, header, list) => {
        const trust = compileTrustProxy(list)
        const client = resolveClientAddress(socket, header, trust)
        if (trust === false) {
          expect(client).toBe(socket)
          return
        }
        const ranges = trust as Exclude<CompiledTrustProxy, false | number>
        if (!trusted(socket, ranges)) {
          expect(client).toBe(socket)
          return
        }
        const chain = [...hopsOf(header), socket]
        const index = chain.lastIndexOf(client!)
        expect(index).toBeGreaterThanOrEqual(0)
        for (const right of chain.slice(index + 1)) expect(trusted(right, ranges)).toBe(true)
        if (index > 0) expect(trusted(client!, ranges)).toBe(false)
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
          if (error !== undefined) expect(error).toBeInstanceOf(TypeError)
          if (error !== undefined) expect((error as Error).message).toMatch(/^trustProxy: /)
        },
      ),
      RUNS,
    )
  })
})
