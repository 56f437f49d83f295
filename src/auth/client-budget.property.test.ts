/**
 * Properties of the key a client's budget counts under: the address is the client's to write.
 */
import { isIP } from 'node:net'
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { budgetKey } from './client-budget.js'

describe('budgetKey', () => {
  const hex = (n: number) => n.toString(16)
  const words = fc.array(fc.integer({ min: 0, max: 0xffff }), { minLength: 8, maxLength: 8 })

  it('an IPv6 address counts by its /64, however it is written; another /64 counts apart', () => {
    fc.assert(
      fc.property(words, words, (a, b) => {
        const full = a.map(hex).join(':')
        const padded = a.map((w) => w.toString(16).padStart(4, '0').toUpperCase()).join(':')
        const sameNet = [...a.slice(0, 4), ...b.slice(4)].map(hex).join(':')
        // An IPv4-mapped address (::ffff:0:0/96) is an IPv4 client, below.
        const mapped = (w: number[]) => w.slice(0, 5).every((x) => x === 0) && w[5] === 0xffff
        fc.pre(!mapped(a) && !mapped([...a.slice(0, 4), ...b.slice(4)]))
        expect(budgetKey(padded)).toBe(budgetKey(full))
        expect(budgetKey(sameNet)).toBe(budgetKey(full))
        if (a[0] !== b[0] || a[1] !== b[1] || a[2] !== b[2] || a[3] !== b[3]) {
          expect(budgetKey(b.map(hex).join(':'))).not.toBe(budgetKey(full))
        }
      }),
    )
  })

  it('text that is no address counts under its hash, apart from every address and other text, never under a key longer than 45 characters', () => {
    const address = fc.oneof(fc.ipV4(), fc.ipV6())
    fc.assert(
      fc.property(fc.string({ maxLength: 20_000 }), fc.string({ maxLength: 20_000 }), address, (a, b, ip) => {
        fc.pre(isIP(a.trim()) === 0 && isIP(b.trim()) === 0)
        expect(budgetKey(a).length).toBeLessThanOrEqual(45)
        if (a !== b) expect(budgetKey(a)).not.toBe(budgetKey(b))
        expect(budgetKey(a)).not.toBe(budgetKey(ip))
      }),
    )
    // "4:123" once shared the key of 0.0.0.123.
    expect(budgetKey('4:123')).not.toBe(budgetKey('0.0.0.123'))
    expect(budgetKey('x'.repeat(15_000)).length).toBeLessThanOrEqual(45)
  })

  it('an IPv4 address counts whole, the same written plain or IPv4-mapped', () => {
    fc.assert(
      fc.property(fc.ipV4(), fc.ipV4(), (a, b) => {
        expect(budgetKey(`::ffff:${a}`)).toBe(budgetKey(a))
        if (a !== b) expect(budgetKey(a)).not.toBe(budgetKey(b))
      }),
    )
  })

  it('only the IPv4-mapped prefix (::ffff:0:0/96) counts as IPv4: the rest of ::/64 (the IPv4-compatible ::a.b.c.d, ::1) counts as the IPv6 /64 it is', () => {
    expect(budgetKey('::192.0.2.7')).not.toBe(budgetKey('192.0.2.7'))
    expect(budgetKey('::1')).toBe(budgetKey('::2'))
    expect(budgetKey('::1')).toBe(budgetKey('::192.0.2.7'))
    expect(budgetKey('::1')).not.toBe(budgetKey('0.0.0.1'))
  })
})
