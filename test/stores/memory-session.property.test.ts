/**
 * The in-memory session store against the way it was first written (a plain `Set` of each
 * user's pin ids, reordered by a delete and an add on every `get`): any sequence of sets, gets,
 * deletes and clock steps gives the same answers, so the per-user order (which pin goes first
 * past `maxPerSubject`) is unchanged by the store's shortcut for the pin used last.
 */
import fc from 'fast-check'
import { LRUCache } from 'lru-cache'
import { describe, expect, it } from 'vitest'
import type { SessionPin, SessionStore } from '../../src/core/stores.js'
import { lruClock } from '../../src/stores/lru-clock.js'
import { createMemorySessionStore } from '../../src/stores/memory/index.js'
import { createTestClock } from './conformance.js'

/** The reference: the store as first written. */
function referenceSessionStore(max: number, maxPerSubject: number, now: () => number): SessionStore {
  const bySubject = new Map<string, Set<string>>()
  const cache = new LRUCache<string, SessionPin>({
    max,
    ttl: 1,
    ttlAutopurge: false,
    ...lruClock(now),
    dispose: (pin, id) => {
      const own = bySubject.get(pin.subject)
      own?.delete(id)
      if (own?.size === 0) bySubject.delete(pin.subject)
    },
  })
  return {
    synchronous: true,
    get(id, ttlMs) {
      const pin = cache.get(id)
      if (pin !== undefined) {
        cache.set(id, pin, { ttl: ttlMs })
        const own = bySubject.get(pin.subject)
        if (own !== undefined) {
          own.delete(id)
          own.add(id)
        }
      }
      return pin
    },
    set(id, pin, ttlMs) {
      if (cache.has(id)) return false
      let own = bySubject.get(pin.subject)
      if (own !== undefined && own.size >= maxPerSubject) {
        for (const old of [...own]) {
          if (cache.has(old)) continue
          own.delete(old)
          cache.delete(old)
        }
        if (own.size === 0) bySubject.delete(pin.subject)
        own = bySubject.get(pin.subject)
      }
      while (own !== undefined && own.size >= maxPerSubject) {
        const oldest = own.values().next().value!
        own.delete(oldest)
        cache.delete(oldest)
        own = bySubject.get(pin.subject)
      }
      cache.set(id, pin, { ttl: ttlMs })
      own = bySubject.get(pin.subject)
      if (!own) bySubject.set(pin.subject, (own = new Set()))
      own.add(id)
      return true
    },
    delete(id) {
      cache.delete(id)
    },
  }
}

const SUBJECTS = ['alice', 'bob', 'carol']
// Two pin objects per user: setting the very object a stale entry holds runs no dispose hook.
const PINS: SessionPin[] = SUBJECTS.flatMap((subject) => [
  { appId: 'a', version: '1.0.0', subject },
  { appId: 'a', version: '2.0.0', subject },
])
const IDS = ['s0', 's1', 's2', 's3', 's4', 's5', 's6', 's7']

type Op =
  | { op: 'set'; id: string; pin: number; ttl: number }
  | { op: 'get'; id: string; ttl: number }
  | { op: 'delete'; id: string }
  | { op: 'advance'; ms: number }

const id = fc.constantFrom(...IDS)
const ttl = fc.constantFrom(1_000, 5_000, 60_000)
const op: fc.Arbitrary<Op> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ op: fc.constant('set' as const), id, pin: fc.nat({ max: PINS.length - 1 }), ttl }) },
  { weight: 4, arbitrary: fc.record({ op: fc.constant('get' as const), id, ttl }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('delete' as const), id }) },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('advance' as const), ms: fc.constantFrom(500, 1_001, 4_000, 61_000) }) },
)

describe('the in-memory session store', () => {
  it('answers every sequence of operations as the store first written did (per-user order, bounds, TTLs)', () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 80 }), fc.constantFrom(3, 5, 100), fc.constantFrom(1, 2, 3), (ops, max, maxPerSubject) => {
        const clock = createTestClock()
        const store = createMemorySessionStore({ max, maxPerSubject, now: clock.now })
        const reference = referenceSessionStore(max, maxPerSubject, clock.now)
        for (const o of ops) {
          if (o.op === 'set') expect(store.set(o.id, PINS[o.pin]!, o.ttl)).toBe(reference.set(o.id, PINS[o.pin]!, o.ttl))
          else if (o.op === 'get') expect(store.get(o.id, o.ttl)).toBe(reference.get(o.id, o.ttl))
          else if (o.op === 'delete') {
            store.delete(o.id)
            reference.delete(o.id)
          } else clock.advance(o.ms)
        }
        for (const i of IDS) expect(store.get(i, 60_000)).toBe(reference.get(i, 60_000))
      }),
      { numRuns: 2000 },
    )
  })

  it('an expired pin written again (the same pin object) keeps its place among its user’s pins', () => {
    const clock = createTestClock()
    const store = createMemorySessionStore({ maxPerSubject: 3, now: clock.now })
    const reference = referenceSessionStore(100, 3, clock.now)
    const pin = PINS[0]!
    for (const s of [store, reference]) {
      s.set('s0', pin, 1_000)
      s.set('s1', pin, 60_000)
    }
    clock.advance(1_001) // s0 expired, s1 live
    for (const s of [store, reference]) {
      expect(s.set('s0', pin, 60_000)).toBe(true) // no dispose hook: s0 stays first, s1 last
      s.get('s0', 60_000) // s0 used last now: s1 the least recently used
      s.set('s2', pin, 60_000)
      s.set('s3', pin, 60_000) // past maxPerSubject: s1 goes
    }
    expect(['s0', 's1', 's2', 's3'].map((i) => reference.get(i, 60_000) !== undefined)).toEqual([true, false, true, true])
    expect(['s0', 's1', 's2', 's3'].map((i) => store.get(i, 60_000) !== undefined)).toEqual([true, false, true, true])
  })
})
