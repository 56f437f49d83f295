import { createHash, createHmac } from 'node:crypto'
import zlib from 'node:zlib'
import { describe, expect, it } from 'vitest'
import {
  API_TOKEN_LENGTH,
  CHECKSUM_LENGTH,
  DEFAULT_TOKEN_PREFIX,
  DISPLAY_PREFIX_LENGTH,
  assertTokenPrefix,
  checkApiTokenFormat,
  crc32,
  displayPrefix,
  generateApiToken,
  hashApiToken,
  hashesEqual,
  parseApiToken,
  toBase62,
} from './api-token.js'

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

/** A deterministic byte source: a counter, so tests get the same token every run. */
function counterBytes(start = 0) {
  let next = start
  return (size: number) => {
    const out = new Uint8Array(size)
    for (let i = 0; i < size; i++) out[i] = next++ & 0xff
    return out
  }
}

/** Builds a token with a valid checksum from a body, as a scanner would verify it: CRC32 of all before it. */
function withChecksum(prefix: string, body: string): string {
  return prefix + body + toBase62(crc32(prefix + body), CHECKSUM_LENGTH)
}

/** Replaces the character at `i` with a different base62 character. */
function flip(token: string, i: number): string {
  const c = token[i]!
  const replacement = BASE62[(BASE62.indexOf(c) + 1) % 62] ?? 'A'
  return token.slice(0, i) + replacement + token.slice(i + 1)
}

describe('constants (spec 2.1, 8)', () => {
  it('48 characters, svc_ prefix, 12 shown', () => {
    expect(API_TOKEN_LENGTH).toBe(48)
    expect(DEFAULT_TOKEN_PREFIX).toBe('svc_')
    expect(DISPLAY_PREFIX_LENGTH).toBe(12)
  })
})

describe('crc32 and toBase62', () => {
  it('crc32 is the IEEE CRC32 (check value of "123456789")', () => {
    expect(crc32('123456789')).toBe(0xcbf43926)
    expect(crc32('')).toBe(0)
    expect(crc32('xx123456789yy', 2, 11)).toBe(0xcbf43926)
  })

  it('toBase62 writes fixed-width digits', () => {
    expect(toBase62(0, 6)).toBe('000000')
    expect(toBase62(61, 2)).toBe('0z')
    expect(toBase62(62, 2)).toBe('10')
    expect(toBase62(0xffffffff, 6)).toBe('4gfFC3')
  })
})

describe('generateApiToken', () => {
  it('is 48 characters, starts with svc_, base62 after the prefix, with a valid checksum', () => {
    for (let i = 0; i < 50; i++) {
      const token = generateApiToken()
      expect(token).toHaveLength(48)
      expect(token.startsWith('svc_')).toBe(true)
      expect(token.slice(4)).toMatch(/^[0-9A-Za-z]{44}$/)
      expect(checkApiTokenFormat(token)).toBeNull()
    }
  })

  it('gives a different token each call', () => {
    const seen = new Set(Array.from({ length: 200 }, () => generateApiToken()))
    expect(seen.size).toBe(200)
  })

  it('uses a custom prefix and keeps 48 characters', () => {
    for (const prefix of ['acme_', 'a_', 'x1_', 'abcdefghijklmno_']) {
      const token = generateApiToken(prefix)
      expect(token).toHaveLength(48)
      expect(token.startsWith(prefix)).toBe(true)
      expect(checkApiTokenFormat(token, prefix)).toBeNull()
      expect(checkApiTokenFormat(token)).toBe('prefix')
    }
  })

  it('refuses an invalid prefix', () => {
    for (const prefix of ['', 'svc', 'SVC_', '_', '1svc_', 'svc-', 'abcdefghijklmnop_', 'sv c_']) {
      expect(() => generateApiToken(prefix)).toThrow(TypeError)
      expect(() => assertTokenPrefix(prefix)).toThrow(TypeError)
    }
  })

  it('is deterministic with an injected random source', () => {
    const a = generateApiToken('svc_', counterBytes(7))
    const b = generateApiToken('svc_', counterBytes(7))
    expect(a).toBe(b)
    expect(checkApiTokenFormat(a)).toBeNull()
    expect(generateApiToken('svc_', counterBytes(8))).not.toBe(a)
  })

  it('skips bytes >= 248 (rejection sampling) and asks for more when needed', () => {
    let calls = 0
    const mostlyRejected = (size: number) => {
      calls++
      // Half the bytes are rejected; the body still gets filled, from the accepted half only.
      return Uint8Array.from({ length: size }, (_, i) => (i % 2 === 0 ? 255 : 62 + 5))
    }
    const token = generateApiToken('svc_', mostlyRejected)
    expect(token.slice(4, 42)).toBe('5'.repeat(38))
    expect(checkApiTokenFormat(token)).toBeNull()
    expect(calls).toBeGreaterThanOrEqual(1)

    calls = 0
    const allRejectedFirst = (size: number) => {
      calls++
      return new Uint8Array(size).fill(calls === 1 ? 250 : 0)
    }
    expect(generateApiToken('svc_', allRejectedFirst).slice(4, 42)).toBe('0'.repeat(38))
    expect(calls).toBe(2)
  })

  it('rejects byte 248 and keeps 247, the highest byte that maps to a base62 digit without bias', () => {
    const edge = (size: number) => Uint8Array.from({ length: size }, (_, i) => (i % 2 === 0 ? 248 : 247))
    // 247 = 3 * 62 + 61: the last digit, 'z'; 248 would be a fifth '0' among 0..247's four.
    expect(generateApiToken('svc_', edge).slice(4, 42)).toBe('z'.repeat(38))
  })

  it('waits out up to 63 draws of unusable bytes, and calls the source broken after 64', () => {
    let calls = 0
    const badFor = (n: number) => (size: number) => new Uint8Array(size).fill(++calls <= n ? 255 : 1)
    expect(generateApiToken('svc_', badFor(63)).slice(4, 42)).toBe('1'.repeat(38))
    expect(calls).toBe(64)
    calls = 0
    expect(() => generateApiToken('svc_', badFor(64))).toThrow('the random source gave no usable bytes')
    expect(calls).toBe(64)
  })

  it('refuses a broken random source with a TypeError instead of waiting on it for ever', () => {
    // Fewer bytes than asked (none at all), the wrong type, or bytes that are all rejected.
    for (const broken of [
      () => new Uint8Array(0),
      (size: number) => new Uint8Array(size - 1),
      (size: number) => Array.from({ length: size }, () => 7) as unknown as Uint8Array,
      (size: number) => new Uint8Array(size).fill(255),
    ]) {
      expect(() => generateApiToken('svc_', broken)).toThrow(TypeError)
    }
    // A Buffer is a Uint8Array: node:crypto's randomBytes answers one.
    expect(checkApiTokenFormat(generateApiToken('svc_', (size) => Buffer.alloc(size, 9)))).toBeNull()
  })
})

describe('checkApiTokenFormat / parseApiToken', () => {
  const token = generateApiToken('svc_', counterBytes(1))

  it('accepts a well-formed token and splits it', () => {
    expect(checkApiTokenFormat(token)).toBeNull()
    expect(parseApiToken(token)).toEqual({ token, prefix: 'svc_', displayPrefix: token.slice(0, 12) })
  })

  it('refuses a wrong prefix', () => {
    const other = 'abc_' + token.slice(4)
    expect(checkApiTokenFormat(other)).toBe('prefix')
    expect(checkApiTokenFormat('Svc_' + token.slice(4))).toBe('prefix')
    expect(checkApiTokenFormat('')).toBe('prefix')
    expect(parseApiToken(other)).toBeNull()
  })

  it('refuses a wrong length', () => {
    expect(checkApiTokenFormat('svc_')).toBe('length')
    expect(checkApiTokenFormat(token.slice(0, 47))).toBe('length')
    expect(checkApiTokenFormat(token + 'A')).toBe('length')
    expect(checkApiTokenFormat(withChecksum('svc_', 'A'.repeat(37)))).toBe('length')
    expect(parseApiToken(token.slice(0, 47))).toBeNull()
  })

  it('refuses characters outside base62', () => {
    for (const bad of ['-', '_', '+', '/', '=', ' ', 'é', '\u0000', '\u{1F600}'.slice(0, 1)]) {
      const forged = token.slice(0, 20) + bad + token.slice(21)
      expect(forged).toHaveLength(48)
      expect(checkApiTokenFormat(forged)).toBe('charset')
    }
    // A bad character inside the checksum part.
    expect(checkApiTokenFormat(token.slice(0, 47) + '!')).toBe('charset')
    // Outside ASCII too, inside the checksum part: the alphabet, not the checksum, refuses it.
    for (const bad of ['é', '\u0100', '\u{1F600}'.slice(0, 1)]) {
      expect(checkApiTokenFormat(token.slice(0, 45) + bad + token.slice(46)), JSON.stringify(bad)).toBe('charset')
    }
  })

  it('refuses a checksum that does not match', () => {
    const body = token.slice(4, 42)
    const wrong = 'svc_' + body + toBase62((crc32('svc_' + body) + 1) >>> 0, CHECKSUM_LENGTH)
    expect(checkApiTokenFormat(wrong)).toBe('checksum')
    expect(parseApiToken(wrong)).toBeNull()
  })

  it('refuses a checksum above 2^32 (6 base62 digits hold more than a CRC32)', () => {
    const body = token.slice(4, 42)
    expect(checkApiTokenFormat('svc_' + body + 'zzzzzz')).not.toBeNull()
  })

  it('refuses every single-character change anywhere in the token', () => {
    for (let i = 0; i < token.length; i++) {
      const mutated = flip(token, i)
      expect(mutated).not.toBe(token)
      expect(checkApiTokenFormat(mutated), `position ${i}`).not.toBeNull()
      expect(parseApiToken(mutated)).toBeNull()
    }
  })

  it('refuses with the prefix it is told to expect', () => {
    const acme = generateApiToken('acme_')
    expect(parseApiToken(acme, 'acme_')?.prefix).toBe('acme_')
    expect(parseApiToken(acme)).toBeNull()
    expect(parseApiToken(token, 'acme_')).toBeNull()
  })

  it('the checksum is the CRC32 of the 42 characters before it, prefix included (DESIGN.md: "of the rest"), as a secret scanner checks it', () => {
    for (const prefix of ['svc_', 'acme_', 'p1_']) {
      const made = generateApiToken(prefix)
      expect(made.slice(42)).toBe(toBase62(zlib.crc32(made.slice(0, 42)), CHECKSUM_LENGTH))
    }
    // The same random part and checksum under another prefix of the same length is refused by
    // its checksum, with that prefix expected.
    const moved = 'abc_' + token.slice(4)
    expect(checkApiTokenFormat(moved, 'abc_')).toBe('checksum')
    expect(checkApiTokenFormat(withChecksum('abc_', token.slice(4, 42)), 'abc_')).toBeNull()
  })
})

describe('displayPrefix', () => {
  it('is the first 12 characters (spec 2.1)', () => {
    const token = generateApiToken()
    expect(displayPrefix(token)).toBe(token.slice(0, 12))
    expect(displayPrefix(token)).toHaveLength(12)
    expect(parseApiToken(token)?.displayPrefix).toBe(displayPrefix(token))
  })
})

describe('hashApiToken', () => {
  const token = generateApiToken()

  it('is SHA-256 hex without a pepper', () => {
    expect(hashApiToken(token)).toBe(createHash('sha256').update(token).digest('hex'))
    expect(hashApiToken(token)).toMatch(/^[0-9a-f]{64}$/)
  })

  it('is HMAC-SHA-256 hex with a pepper, and differs from the plain hash', () => {
    const peppered = hashApiToken(token, 'pepper')
    expect(peppered).toBe(createHmac('sha256', 'pepper').update(token).digest('hex'))
    expect(peppered).not.toBe(hashApiToken(token))
    expect(hashApiToken(token, 'other')).not.toBe(peppered)
    expect(hashApiToken(token, new TextEncoder().encode('pepper'))).toBe(peppered)
  })

  it('never contains the secret', () => {
    expect(hashApiToken(token)).not.toContain(token)
  })
})

describe('hashesEqual', () => {
  it('is true for equal digests, false otherwise', () => {
    const a = hashApiToken('svc_a')
    expect(hashesEqual(a, a)).toBe(true)
    expect(hashesEqual(a, String(a))).toBe(true)
    expect(hashesEqual(a, hashApiToken('svc_b'))).toBe(false)
    expect(hashesEqual(a, a.slice(1))).toBe(false)
    expect(hashesEqual('', '')).toBe(true)
  })

  it('does not confuse characters outside latin1', () => {
    expect(hashesEqual('\u0100', '\u0000')).toBe(false)
    expect(hashesEqual('a\u0161', 'aa')).toBe(false)
    expect(hashesEqual('\u00e9', 'e\u0301'.slice(0, 1))).toBe(false)
  })
})
