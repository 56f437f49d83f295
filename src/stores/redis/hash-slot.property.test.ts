/**
 * Properties of `hashSlot`, the Redis Cluster slot the stores use to tell which master holds a
 * key (Redis Cluster specification, "Key distribution model"):
 *
 * - For any string, the slot is an integer in [0, 16383] and equals a reference computed here
 *   independently: the key's UTF-8 bytes as Node sends them (`Buffer.from`, lone surrogates as
 *   U+FFFD), cut to the hash tag when there is one (the bytes between the first `{` and the first
 *   `}` after it, when not empty), and CRC16-XMODEM as the remainder of a polynomial division
 *   over GF(2) carried out on a BigInt (not the shift-register loop of the code), modulo 16,384.
 * - A key with a hash tag has the slot of the tag alone, whatever surrounds it (the property
 *   multi-key commands of the stores rely on); `{}` and a `}` before any `{` are no tag.
 * - The specification's check value (CRC16 of `123456789` is 0x31C3) and slots Redis answers
 *   for `CLUSTER KEYSLOT` (`foo` 12182, `bar` 5061, `hello` 866).
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { hashSlot } from './client.js'

const RUNS = { numRuns: 1000 }
const POLY = 0x11021n

/** CRC16-XMODEM of `bytes`: the remainder of bytes(x) * x^16 divided by x^16 + x^12 + x^5 + 1. */
function crc16(bytes: Uint8Array): number {
  let message = 0n
  for (const byte of bytes) message = (message << 8n) | BigInt(byte)
  let remainder = message << 16n
  for (let bit = BigInt(bytes.length * 8 + 15); bit >= 16n; bit--) {
    if ((remainder >> bit) & 1n) remainder ^= POLY << (bit - 16n)
  }
  return Number(remainder)
}

/** The reference slot: hash tag rule on the bytes, then the CRC. */
function slotModel(key: string): number {
  const bytes = new Uint8Array(Buffer.from(key, 'utf8'))
  let hashed = bytes
  const open = bytes.indexOf(0x7b)
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1)
    if (close !== -1 && close > open + 1) hashed = bytes.subarray(open + 1, close)
  }
  return crc16(hashed) % 16384
}

/** The hash tag of a key, by the specification's words (on the string: `{` and `}` are ASCII). */
function tagOf(key: string): string | undefined {
  const open = key.indexOf('{')
  if (open === -1) return undefined
  const close = key.indexOf('}', open + 1)
  return close > open + 1 ? key.slice(open + 1, close) : undefined
}

/** Key pieces: braces, ASCII, store-key punctuation, multi-byte and astral characters, lone surrogates. */
const piece = fc.constantFrom('{', '}', '{', '}', 'a', 'Z', '0', ':', '.', 'user', '1000', 'mcpd:', 'rl:', '\u00e9', '\u4e2d', '\ud83d\ude00', '\ud800', '\udc00', ' ', '\u0000')
const key = fc.oneof(
  fc.string({ unit: piece, maxLength: 12 }),
  fc.string({ maxLength: 30 }),
  fc.tuple(fc.stringMatching(/^[a-z:]{0,8}$/), fc.string({ unit: piece, minLength: 1, maxLength: 6 }), fc.string({ unit: piece, maxLength: 6 })).map(([p, t, s]) => `${p}{${t}}${s}`),
)

describe('hashSlot, property-based', () => {
  it('is the CRC16-XMODEM of the key (or of its hash tag) modulo 16,384, by an independent reference', () => {
    const seen = { tagged: 0, emptyTag: 0, closeBeforeOpen: 0, openOnly: 0, noBrace: 0, multiByte: 0, loneSurrogate: 0 }
    fc.assert(
      fc.property(key, (k) => {
        const slot = hashSlot(k)
        expect(Number.isInteger(slot)).toBe(true)
        expect(slot).toBeGreaterThanOrEqual(0)
        expect(slot).toBeLessThanOrEqual(16383)
        expect(slot).toBe(slotModel(k))

        const open = k.indexOf('{')
        if (tagOf(k) !== undefined) seen.tagged++
        else if (open !== -1 && k[open + 1] === '}') seen.emptyTag++
        else if (open !== -1 && k.indexOf('}') !== -1 && k.indexOf('}') < open) seen.closeBeforeOpen++
        else if (open !== -1) seen.openOnly++
        else seen.noBrace++
        if ([...k].some((c) => c.codePointAt(0)! > 0x7f)) seen.multiByte++
        if (/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/.test(k)) seen.loneSurrogate++
      }),
      RUNS,
    )
    // About 330 tagged, 50 with an empty tag first, 25 with a } before the first { (11 to 37 over 85
    // runs: a bound of 8 failed about one run in 5,000; 3, one in ten million), 80 with a { alone,
    // 500 without one; 470 with multi-byte characters, 280 with lone surrogates.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(name === 'closeBeforeOpen' ? 3 : name === 'emptyTag' ? 15 : 40)
  })

  it('a key with a hash tag has the slot of the tag alone, whatever surrounds it', () => {
    const tag = fc.string({ unit: fc.constantFrom('a', 'Z', '0', ':', '{', '\u00e9', '\ud83d\ude00', '\ud800'), minLength: 1, maxLength: 10 })
    const before = fc.string({ unit: fc.constantFrom('a', ':', '}', '\u4e2d'), maxLength: 6 })
    const after = fc.string({ unit: piece, maxLength: 8 })
    fc.assert(
      fc.property(before, tag, after, (b, t, a) => {
        const slot = hashSlot(`${b}{${t}}${a}`)
        expect(slot).toBe(hashSlot(t))
        expect(slot).toBe(crc16(new Uint8Array(Buffer.from(t, 'utf8'))) % 16384)
      }),
      RUNS,
    )
  })

  it('agrees with the specification and with Redis on known keys', () => {
    expect(crc16(new TextEncoder().encode('123456789'))).toBe(0x31c3)
    expect(hashSlot('123456789')).toBe(0x31c3 % 16384)
    expect(hashSlot('foo')).toBe(12182)
    expect(hashSlot('bar')).toBe(5061)
    expect(hashSlot('hello')).toBe(866)
    expect(hashSlot('{user1000}.following')).toBe(hashSlot('{user1000}.followers'))
    expect(hashSlot('foo{}{bar}')).toBe(slotModel('foo{}{bar}'))
    expect(hashSlot('foo{{bar}}zap')).toBe(hashSlot('{bar'))
    expect(hashSlot('foo{bar}{zap}')).toBe(hashSlot('bar'))
  })
})
