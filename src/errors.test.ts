import { afterEach, describe, expect, it, vi } from 'vitest'
import { StoreUnavailableError, logError } from './errors.js'

describe('logError, the default onError', () => {
  afterEach(() => vi.restoreAllMocks())

  function logged(error: unknown, context: string): string {
    const lines: string[] = []
    vi.spyOn(console, 'error').mockImplementation((line: string) => void lines.push(line))
    logError(error, context)
    expect(lines).toHaveLength(1)
    return lines[0]!
  }

  it('names the error and the class and code of its causes, so an operator tells a missing migration from an outage', () => {
    const pg = Object.assign(new Error('relation "public.mcp_dispatch_api_tokens" does not exist'), { name: 'error', code: '42P01' })
    expect(logged(new StoreUnavailableError('token', { cause: pg }), 'token')).toBe(
      '[mcp-dispatch] token: StoreUnavailableError: token store unavailable (cause: error 42P01: PostgreSQL undefined_table: a table is missing (the token store\'s: run its migrate(), docs/stores.md "Migration"); looked for: "public.mcp_dispatch_api_tokens")',
    )
    // The table looked for is said only from PostgreSQL's own wording of a missing relation: the
    // name is the store's SQL's. Any other message of the code stays unsaid.
    const odd = Object.assign(new Error('relation "a" does not exist, near "secret"'), { name: 'error', code: '42P01' })
    expect(logged(new StoreUnavailableError('token', { cause: odd }), 'token')).not.toContain('looked for')
    const refused = Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' })
    const chain = new Error('fetch failed', { cause: new TypeError('wrapped', { cause: refused }) })
    expect(logged(chain, 'userinfo')).toBe('[mcp-dispatch] userinfo: Error: fetch failed (cause: TypeError) (cause: Error ECONNREFUSED)')
    // A missing column, a role without its grants: what to do, beside the code.
    const column = Object.assign(new Error('column "x" does not exist'), { name: 'error', code: '42703' })
    expect(logged(new StoreUnavailableError('token', { cause: column }), 'token')).toContain('(cause: error 42703: PostgreSQL undefined_column: a column is missing')
    const grant = Object.assign(new Error('permission denied for table t'), { name: 'error', code: '42501' })
    expect(logged(new StoreUnavailableError('app', { cause: grant }), 'token service')).toContain('(cause: error 42501: PostgreSQL insufficient_privilege: the role lacks a grant')
    // Codes with no advice stay bare.
    const other = Object.assign(new Error('x'), { name: 'error', code: '23505' })
    expect(logged(new Error('w', { cause: other }), 'x')).toBe('[mcp-dispatch] x: Error: w (cause: error 23505)')
  })

  it("never prints a cause's message, which a driver or a parser may fill with what it read", () => {
    const parse = new SyntaxError('Unexpected token \'a\', "alice@example.com" is not valid JSON')
    const line = logged(new Error('userinfo: answer is not JSON', { cause: parse }), 'oauth')
    expect(line).toBe('[mcp-dispatch] oauth: Error: userinfo: answer is not JSON (cause: SyntaxError)')
    expect(line).not.toContain('alice')
    expect(logged('a string', 'x')).toBe('[mcp-dispatch] x: a string')
  })
})
