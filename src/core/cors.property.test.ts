import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { ALLOW_HEADERS, MAX_PARAM_HEADERS, isFieldName, preflightAllowHeaders, requestedParamHeaders } from './cors.js'

const TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
const PARAM_NAME = /^mcp-param-[!#$%&'*+\-.^_`|~0-9a-z]+$/

/** One item of an `Access-Control-Request-Headers` list, with what it must give. */
type Item = { text: string; param: string | undefined }

/** A valid `Mcp-Param-*` name, in any case: it must come out lower case. */
const paramItem: fc.Arbitrary<Item> = fc
  .tuple(
    fc.constantFrom('mcp-param-', 'Mcp-Param-', 'MCP-PARAM-', 'mCp-pArAm-'),
    fc.string({ unit: fc.constantFrom(...TCHAR), minLength: 1, maxLength: 20 }),
  )
  .map(([prefix, name]) => ({ text: prefix + name, param: (prefix + name).toLowerCase() }))

/** Anything else a browser (or an attacker) may put in the list: never allowed. */
const otherItem: fc.Arbitrary<Item> = fc
  .oneof(
    fc.constantFrom('authorization', 'content-type', 'mcp-method', 'mcp-name', 'x-custom', 'mcp-param-', 'mcp-params-x', 'mcp-param'),
    fc.string({ unit: 'binary', maxLength: 30 }).filter((s) => !s.includes(',')).map((s) => `mcp-param-a${s}\u0000`),
    fc.string({ unit: fc.constantFrom(' ', '"', '(', ')', '/', ':', ';', '<', '=', '>', '?', '@', '[', '\\', ']', '{', '}', '\r', '\n', 'é'), minLength: 1, maxLength: 5 }).map((s) => `mcp-param-x${s}y`),
    fc.string({ unit: fc.constantFrom(...TCHAR), minLength: 119, maxLength: 140 }).map((s) => `mcp-param-${s}`),
  )
  .map((text) => ({ text, param: undefined }))

const ows = fc.string({ unit: fc.constantFrom(' ', '\t'), maxLength: 3 })

describe('requestedParamHeaders / preflightAllowHeaders', () => {
  it('allows exactly the valid Mcp-Param-* names asked for, lower case, each once, in order, at most 64', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(ows, fc.oneof(paramItem, otherItem), ows), { maxLength: 80 }), (items) => {
        const requested = items.map(([before, item, after]) => before + item.text + after).join(',')
        const expected: string[] = []
        for (const [, item] of items) {
          const name = item.param
          if (name !== undefined && name.length <= 128 && !expected.includes(name)) expected.push(name)
        }
        const names = requestedParamHeaders(requested)
        expect(names).toEqual(expected.slice(0, MAX_PARAM_HEADERS))
        expect(preflightAllowHeaders(requested)).toBe(names.length === 0 ? ALLOW_HEADERS : `${ALLOW_HEADERS}, ${names.join(', ')}`)
      }),
      { numRuns: 1000 },
    )
  })

  it('whatever the request says, the answer is the MCP list plus valid header names only', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string({ unit: 'binary', maxLength: 300 }), fc.constant(null), fc.constant(undefined)), (requested) => {
        const value = preflightAllowHeaders(requested)
        expect(value.startsWith(ALLOW_HEADERS)).toBe(true)
        const extra = value.slice(ALLOW_HEADERS.length)
        if (extra !== '') for (const name of extra.slice(2).split(', ')) expect(name).toMatch(PARAM_NAME)
        for (const bad of ['\r', '\n', '\u0000']) expect(value.includes(bad)).toBe(false)
      }),
      { numRuns: 1000 },
    )
  })

  it('lists every MCP request header, 2025 and 2026 revisions', () => {
    const names = ALLOW_HEADERS.toLowerCase().split(', ')
    for (const name of ['authorization', 'content-type', 'accept', 'mcp-session-id', 'mcp-protocol-version', 'last-event-id', 'mcp-method', 'mcp-name']) {
      expect(names).toContain(name)
    }
    expect(preflightAllowHeaders('Authorization, Mcp-Method')).toBe(ALLOW_HEADERS)
    expect(preflightAllowHeaders(' MCP-Param-Region ,mcp-param-region, mcp-param-Tenant_ID')).toBe(
      `${ALLOW_HEADERS}, mcp-param-region, mcp-param-tenant_id`,
    )
  })

  it('stops at 64 names however many are asked for', () => {
    const many = Array.from({ length: 500 }, (_, i) => `mcp-param-p${i}`).join(',')
    const names = requestedParamHeaders(many)
    expect(names).toHaveLength(MAX_PARAM_HEADERS)
    expect(names[63]).toBe('mcp-param-p63')
  })

  it('allows a name of 128 characters, the prefix included, and no longer one', () => {
    const name = (length: number) => `mcp-param-${'a'.repeat(length - 10)}`
    expect(requestedParamHeaders(`${name(128)}, ${name(129)}`)).toEqual([name(128)])
  })
})

describe('isFieldName (RFC 9110 section 5.1), what a header name the platform configures must be', () => {
  const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
  const tchars = fc.string({ unit: fc.constantFrom(...TCHAR), maxLength: 12 })

  it('is one or more tchar, for any string', () => {
    fc.assert(
      fc.property(
        fc.oneof(
          tchars,
          fc.string({ unit: 'binary', maxLength: 12 }),
          // One character that is no tchar, anywhere: first, last or inside.
          fc.tuple(tchars, fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }).filter((c) => !TCHAR.includes(c)), tchars).map(([a, c, b]) => a + c + b),
        ),
        (name) => {
          expect(isFieldName(name), JSON.stringify(name)).toBe(TOKEN.test(name))
        },
      ),
      { numRuns: 1000 },
    )
  })

  it('takes every tchar, first or last, and refuses the empty name and a space or colon in front', () => {
    expect(isFieldName(TCHAR)).toBe(true)
    expect(isFieldName('X-Zone')).toBe(true)
    expect(isFieldName('Z')).toBe(true)
    for (const bad of ['', ' X-Id', ':authority', 'X-Id ', 'X Id', 'X-Id:']) expect(isFieldName(bad), JSON.stringify(bad)).toBe(false)
  })
})
