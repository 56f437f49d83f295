/**
 * The redaction that keeps a pasted secret out of error messages (`looksSecret`, `quotable`,
 * `quoted`), property-based, against a reference written from text.ts's own statement of the
 * contract: a text looks secret when it holds a run of 20 or more ASCII letters and digits
 * with an upper-case letter, a lower-case letter and a digit all in that run; such a text is
 * never quoted, anything else is quoted as it is, cut to its first `max` code points (a
 * surrogate pair is one) and `…` when longer; in JSON quotes (`quoted`), it reads back as the
 * text shown and holds no control, format or separator character, nor a lone surrogate.
 *
 * What the redaction is for: an API token pasted into the wrong field must not come back in
 * the 400's message (error bodies end up in logs). So the messages of the public functions
 * that quote their input are checked too: `validateAllowlist` and `compileAllowlist` (an
 * allowlist entry), `applyDeploy` (a version), and the token service (an unknown field's name,
 * an allowlist entry).
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { createMemoryAppStore, createMemoryTokenStore } from '../stores/memory/index.js'
import { createTokenService } from '../tokens/token-service.js'
import { generateApiToken } from './api-token.js'
import { compileAllowlist, validateAllowlist } from './ip.js'
import { NOT_SHOWN, looksSecret, quotable, quoted } from './text.js'
import { applyDeploy } from './versions.js'

const RUNS = { numRuns: 300 }

/**
 * text.ts's contract, written apart from it: a maximal run of 20+ ASCII letters and digits
 * holding all three classes, or of 24+ with `-` and `_` too, or of 64+ letters and digits with
 * a letter and a digit; or a URL whose authority holds `@`.
 */
function looksSecretReference(text: string): boolean {
  const all = (run: string) => /[a-z]/.test(run) && /[A-Z]/.test(run) && /[0-9]/.test(run)
  const alnum = (text.match(/[A-Za-z0-9]+/g) ?? []).some((run) => (run.length >= 20 && all(run)) || (run.length >= 64 && /[0-9]/.test(run) && /[A-Za-z]/.test(run)))
  const urlSafe = (text.match(/[A-Za-z0-9_-]+/g) ?? []).some((run) => run.length >= 24 && all(run))
  const credentials = text.split('://').slice(1).some((rest) => /^[^/?#\s@]*@/.test(rest))
  return alnum || urlSafe || credentials
}

const isHighSurrogate = (unit: number) => unit >= 0xd800 && unit <= 0xdbff

/**
 * Text near the boundary of the rule: runs of letters and digits of one, two or three of the
 * classes, often 18 to 26 or 62 to 66 long (around the 20, 24 and 64 the rule counts), between
 * separators that do and do not break a run (`_`, `-`, space, non-ASCII letters, astral, a lone
 * surrogate), and URL pieces (`://`, `@`).
 */
const CLASSES = ['abcxyz', 'ABCXYZ', '01589'] as const
const run = fc
  .tuple(fc.subarray([...CLASSES], { minLength: 1 }), fc.oneof(fc.integer({ min: 18, max: 26 }), fc.integer({ min: 30, max: 34 }), fc.integer({ min: 62, max: 66 }), fc.integer({ min: 1, max: 40 })))
  .chain(([classes, length]) => fc.string({ unit: fc.constantFrom(...classes.join('')), minLength: length, maxLength: length }))
const separator = fc.constantFrom('', '_', '-', '.', ' ', '/', ':', '%', '@', '://', 'https://', '\u00e9', '\u0410', '\ud83d\ude00', '\ud800')
const nearSecret = fc.array(fc.tuple(separator, run), { maxLength: 4 }).map((parts) => parts.flat().join(''))
const anyText = fc.oneof(nearSecret, fc.string({ unit: 'binary', maxLength: 90 }), fc.string({ unit: 'grapheme', maxLength: 30 }))

/** Any prefix the library allows (`assertTokenPrefix`): `svc_`, the default, or another. */
const prefix = fc.oneof(fc.constant('svc_'), fc.stringMatching(/^[a-z][a-z0-9]{0,14}_$/))

/**
 * A random source that answers `bytes`, then (should rejection sampling drop so many that it
 * asks again) the same bytes xor-ed with the pass number, so generation always ends.
 */
function replay(bytes: Uint8Array) {
  let position = 0
  return (size: number) => {
    const out = new Uint8Array(size)
    for (let i = 0; i < size; i++, position++) out[i] = bytes[position % bytes.length]! ^ (Math.floor(position / bytes.length) & 0xff)
    return out
  }
}

/**
 * Tokens as `generateApiToken` makes them from a working source: uniform bytes (`noBias`: no
 * skew to small values), 96 of them, more than the 2 bytes per character it asks for at once.
 *
 * Every token holds one run of 32 to 46 letters and digits after its prefix's `_`, and a digit
 * in it: its checksum's first character is one of `0`–`4` (a CRC32 is below 5 × 62^5). Both
 * letter cases are there but in a token whose random part misses one, about 1 in 10^7 with the
 * longest prefix (1 in 10^10 with `svc_`): such a token is not recognised (`looksSecret` wants
 * all three classes). The properties below take only tokens with both cases (`hasBothCases`,
 * as an explicit `fc.pre`), so that limit of the rule is stated, not hidden in a flaky run.
 */
const token = fc.tuple(prefix, fc.noBias(fc.uint8Array({ minLength: 96, maxLength: 96 }))).map(([p, bytes]) => generateApiToken(p, replay(bytes)))
const hasBothCases = (t: string) => /[a-z]/.test(t.slice(t.indexOf('_') + 1)) && /[A-Z]/.test(t.slice(t.indexOf('_') + 1))

/** Where a pasted token ends up in a field: alone, with spaces, a zone index, brackets, a CIDR suffix, after a prefix length, doubled (past the length bound), among text. */
const pasted = fc.tuple(
  token,
  fc.constantFrom(
    (t: string) => t,
    (t: string) => ` ${t}`,
    (t: string) => `${t}\n`,
    (t: string) => `${t}%eth0`,
    (t: string) => `[${t}]`,
    (t: string) => `${t}/24`,
    (t: string) => `10.0.0.0/${t}`,
    (t: string) => `${t}${t}`,
    (t: string) => `Bearer ${t}`,
    (t: string) => `1.0.0-${t}`,
  ),
).map(([t, place]) => ({ token: t, text: place(t) }))

/** Every text an error carries: message, stack, `String(error)`, and its string properties (`field`). */
function textsOf(error: unknown): string[] {
  if (!(error instanceof Error)) return [String(error)]
  const own = Object.values(error).filter((v): v is string => typeof v === 'string')
  return [error.message, error.stack ?? '', String(error), ...own]
}

function thrown(act: () => unknown): unknown {
  try {
    act()
  } catch (error) {
    return error
  }
  return undefined
}

describe('looksSecret, quotable and quoted, property-based', () => {
  it('looksSecret is exactly the rule text.ts states, for any text', () => {
    fc.assert(
      fc.property(anyText, (text) => {
        expect(looksSecret(text)).toBe(looksSecretReference(text))
      }),
      { numRuns: 1000 },
    )
  })

  it('what does not look secret is quoted as it is up to max code points, cut at max with … past it; what does is never quoted', () => {
    fc.assert(
      fc.property(anyText, fc.integer({ min: 1, max: 100 }), (text, max) => {
        const shown = quotable(text, max)
        if (looksSecretReference(text)) {
          expect(shown).toBe(NOT_SHOWN)
          expect(quoted(text, max)).toBe(NOT_SHOWN)
          return
        }
        // Code points, a lone surrogate counted as one as a pair is.
        const points = Array.from(text)
        expect(shown).toBe(points.length <= max ? text : `${points.slice(0, max).join('')}…`)
        // In JSON quotes, so spaces show: it reads back as shown, and holds nothing a reader
        // cannot see or a log line breaks on, nor a lone surrogate (a strict decoder's refusal).
        const inQuotes = quoted(text, max)
        expect(JSON.parse(inQuotes)).toBe(shown)
        expect(inQuotes).not.toMatch(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]/u)
      }),
      { numRuns: 1000 },
    )
  })

  it('a cut never holds more than max code points of the text, nor half a pair the text had whole', () => {
    fc.assert(
      fc.property(fc.string({ unit: fc.constantFrom('a', ' ', '\ud83d\ude00', '\u00e9'), minLength: 1, maxLength: 80 }), fc.integer({ min: 1, max: 80 }), (text, max) => {
        const shown = quotable(text, max)
        const kept = shown.endsWith('…') && text.length > max ? shown.slice(0, -1) : shown
        expect(text.startsWith(kept)).toBe(true)
        expect(Array.from(kept).length).toBeLessThanOrEqual(max)
        // Here every surrogate is half of a pair: none left alone at the end of the cut.
        expect(isHighSurrogate(kept.charCodeAt(kept.length - 1))).toBe(false)
      }),
      RUNS,
    )
  })

  it('any API token, with any prefix the library allows, is never quoted', () => {
    fc.assert(
      fc.property(pasted, fc.integer({ min: 1, max: 200 }), ({ token: t, text }, max) => {
        // Both letter cases in its random part: every token from a working source but about 1 in 10^7 (see `token`).
        fc.pre(hasBothCases(t))
        expect(looksSecret(text)).toBe(true)
        expect(quotable(text, max)).toBe(NOT_SHOWN)
        expect(quoted(text, max)).toBe(NOT_SHOWN)
      }),
      RUNS,
    )
  })
})

describe('looksSecret at the edges of its rule', () => {
  it('a base64url run counts from 24 characters, however short its runs of letters and digits alone', () => {
    const run24 = 'aB3_'.repeat(6)
    expect(looksSecret(run24)).toBe(true)
    expect(looksSecret(`id ${'Ab-9'.repeat(6)} seen`)).toBe(true)
    expect(looksSecret(run24.slice(1))).toBe(false) // 23 characters
    expect(looksSecret('Ab-9'.repeat(6).slice(0, 23))).toBe(false)
  })

  it('a URL names credentials only with an @ in its authority, not in its path', () => {
    expect(looksSecret('https://user:pw@example.com/')).toBe(true)
    expect(looksSecret('redis://:pw@cache:6379')).toBe(true)
    expect(looksSecret('https://example.com/@weather')).toBe(false)
    expect(quotable('https://example.com/users/@alice')).toBe('https://example.com/users/@alice')
  })
})

describe('messages that quote input never hold a pasted token, and quote the rest faithfully', () => {
  it('validateAllowlist and compileAllowlist: a token in any position of an entry is not shown', () => {
    fc.assert(
      fc.property(pasted, fc.array(fc.constantFrom('10.0.0.1', '2001:db8::/32', '192.168.0.0/16'), { maxLength: 3 }), ({ token: t, text }, before) => {
        fc.pre(hasBothCases(t))
        const entries = [...before, text]
        const problem = validateAllowlist(entries)
        // No pasted form of a token is an address or a range.
        expect(problem).not.toBeNull()
        expect(problem!.index).toBe(before.length)
        expect(problem!.message).not.toContain(t)
        expect(problem!.message).toContain(`(${NOT_SHOWN})`)
        for (const line of textsOf(thrown(() => compileAllowlist(entries)))) expect(line).not.toContain(t)
      }),
      RUNS,
    )
  })

  it('validateAllowlist: any other refused entry is named by index and quoted as it is (60 code points at most)', () => {
    const entryText = fc.oneof(
      nearSecret,
      fc.string({ unit: fc.constantFrom('1', '0', '9', 'f', ':', '.', '/', '%', '[', ']', ' ', 'x', '"', '\\', '\n'), maxLength: 70 }),
      fc.constantFrom('localhost', 'example.com', '10.0.0.1/33', '::1/129', '10.0.0.1/24', ' 10.0.0.1', 'fe80::1%eth0', '[::1]'),
    )
    fc.assert(
      fc.property(entryText, (entry) => {
        const problem = validateAllowlist([entry])
        if (problem === null) return
        expect(problem.index).toBe(0)
        expect(problem.message.startsWith('entry 0 (')).toBe(true)
        if (looksSecretReference(entry)) expect(problem.message).toContain(`(${NOT_SHOWN})`)
        else if (Array.from(entry).length <= 60) expect(problem.message).toContain(`(${JSON.stringify(entry)})`)
        // Longer: cut (a surrogate pair kept whole), never sent back whole.
        else expect(problem.message).toContain(`(${JSON.stringify(`${Array.from(entry).slice(0, 60).join('')}…`)})`)
      }),
      { numRuns: 1000 },
    )
  })

  it('applyDeploy: a token given as a version is not shown in the refusal; a short bad version is quoted as it is', () => {
    fc.assert(
      fc.property(pasted, fc.constantFrom('1.2', 'v1.0.0', 'latest', '1.0.0+build', ''), ({ token: t, text }, plain) => {
        fc.pre(hasBothCases(t))
        // `1.0.0-<token>` is no version (`_` is not a pre-release character): every form is refused.
        const refusal = thrown(() => applyDeploy(['1.0.0'], text))
        expect(refusal).toBeInstanceOf(Error)
        expect((refusal as Error).message).toContain(NOT_SHOWN)
        // `version` is the input the caller gave (a property, for code); it is in no text of the error.
        for (const line of [(refusal as Error).message, (refusal as Error).stack ?? '', String(refusal)]) expect(line).not.toContain(t)
        expect((thrown(() => applyDeploy(['1.0.0'], plain)) as Error).message).toContain(JSON.stringify(plain))
      }),
      RUNS,
    )
  })

  it('the token service: a token as an unknown field name or an allowlist entry is not shown in the 400', async () => {
    const apps = createMemoryAppStore([{ id: 'app_a', slug: 'a', name: 'A' }])
    const service = createTokenService({ store: createMemoryTokenStore(), apps, canUseServer: () => true })
    try {
      await fc.assert(
        fc.asyncProperty(pasted, fc.boolean(), async ({ token: t, text }, asKey) => {
          fc.pre(hasBothCases(t))
          // An edit names its fields strictly (an unknown one is refused before any lookup); a creation's allowlist is checked entry by entry.
          const error = await (asKey
            ? service.update('alice', 'tok_any', { [text]: true } as never)
            : service.create({ userId: 'alice', name: 'CI', servers: ['app_a'], expiresInDays: 30, allowedIps: ['10.0.0.1', text] })
          ).then(() => undefined, (e: unknown) => e)
          expect(error).toBeInstanceOf(Error)
          expect((error as { status?: number }).status).toBe(400)
          for (const line of textsOf(error)) expect(line).not.toContain(t)
        }),
        { numRuns: 100 },
      )
    } finally {
      await service.close()
    }
  })
})
