/**
 * The request headers a CORS preflight of the MCP endpoint allows (pure, no I/O).
 *
 * A browser-based MCP client sends `Authorization`, `Content-Type`, `Accept` and the headers
 * of the Streamable HTTP transport: `Mcp-Session-Id`, `Mcp-Protocol-Version` and
 * `Last-Event-ID` (2025-03-26 to 2025-11-25), `Mcp-Method` and `Mcp-Name` (2026-07-28), and,
 * for tools whose arguments are mirrored into headers (`x-mcp-header`, 2026-07-28), one
 * `Mcp-Param-{name}` header per argument. The names of those are chosen by each App's tools, so
 * a preflight allows the ones the browser asks for (`Access-Control-Request-Headers`), and no
 * other header it asks for.
 * @module
 */

/** The request headers every preflight allows. */
export const ALLOW_HEADERS =
  'Authorization, Content-Type, Accept, Mcp-Session-Id, Mcp-Protocol-Version, Last-Event-ID, Mcp-Method, Mcp-Name'

const PARAM_PREFIX = 'mcp-param-'
/** At most this many `Mcp-Param-*` names are allowed by one preflight. */
export const MAX_PARAM_HEADERS = 64
/** Longest `Mcp-Param-*` name allowed (the prefix included). */
const MAX_NAME_LENGTH = 128

/** RFC 9110 tchar: letters, digits, and ! # $ % & ' * + - . ^ _ ` | ~ */
function isTchar(c: number): boolean {
  return (
    (c >= 0x61 && c <= 0x7a) || // a-z
    (c >= 0x30 && c <= 0x39) || // 0-9
    (c >= 0x41 && c <= 0x5a) || // A-Z
    c === 0x21 ||
    (c >= 0x23 && c <= 0x27) || // # $ % & '
    c === 0x2a ||
    c === 0x2b ||
    c === 0x2d ||
    c === 0x2e ||
    c === 0x5e ||
    c === 0x5f ||
    c === 0x60 ||
    c === 0x7c ||
    c === 0x7e
  )
}

/**
 * Whether `name` is an HTTP field name (RFC 9110 section 5.1): one or more `tchar`.
 * @internal
 */
export function isFieldName(name: string): boolean {
  if (name.length === 0) return false
  for (let i = 0; i < name.length; i++) if (!isTchar(name.charCodeAt(i))) return false
  return true
}

/** Whether `name` (lower case) is an `Mcp-Param-{name}` header name: the prefix, then one or more `tchar`. */
function isParamHeader(name: string): boolean {
  if (name.length <= PARAM_PREFIX.length || name.length > MAX_NAME_LENGTH || !name.startsWith(PARAM_PREFIX)) return false
  for (let i = PARAM_PREFIX.length; i < name.length; i++) if (!isTchar(name.charCodeAt(i))) return false
  return true
}

/**
 * The `Mcp-Param-*` header names among a preflight's `Access-Control-Request-Headers` value:
 * lower case, each once, in the order asked, at most {@link MAX_PARAM_HEADERS}. Anything else
 * in the value (other headers, malformed names) is left out.
 *
 * @example
 * ```ts
 * requestedParamHeaders('authorization, Mcp-Param-Region, x-other') // ['mcp-param-region']
 * ```
 */
export function requestedParamHeaders(requested: string | null | undefined): string[] {
  const names: string[] = []
  if (!requested) return names
  for (const item of requested.split(',')) {
    const name = item.trim().toLowerCase()
    if (isParamHeader(name) && !names.includes(name)) {
      names.push(name)
      if (names.length === MAX_PARAM_HEADERS) break
    }
  }
  return names
}

/**
 * `Access-Control-Allow-Headers` for a preflight that asked for `requested`: {@link ALLOW_HEADERS},
 * then the `Mcp-Param-*` names asked for (see {@link requestedParamHeaders}).
 *
 * @example
 * ```ts
 * preflightAllowHeaders('mcp-method, mcp-param-region') // ALLOW_HEADERS + ', mcp-param-region'
 * ```
 */
export function preflightAllowHeaders(requested: string | null | undefined): string {
  const params = requestedParamHeaders(requested)
  return params.length === 0 ? ALLOW_HEADERS : `${ALLOW_HEADERS}, ${params.join(', ')}`
}
