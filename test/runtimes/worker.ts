/**
 * The platform of `app.ts` as a Cloudflare Worker (a `modules` Worker), for workerd: bundled by
 * esbuild with `mcp-dispatch` and `mcp-dispatch/web` resolved to dist/, the built package
 * (`workerd.ts`). Everything is created in global scope, as a Worker's platform would be. Its
 * options come from the bindings `workerd.ts` writes into the config (text bindings, so numbers
 * are strings).
 *
 * Two platforms with those options: the one a Worker gets by default, and, for requests with
 * `X-Test-Variant: wait-until`, one whose token service and validators are handed `waitUntil`
 * of `cloudflare:workers`.
 */
import { env, waitUntil } from 'cloudflare:workers'
import * as lib from 'mcp-dispatch'
import * as web from 'mcp-dispatch/web'
import { type RuntimeAppOptions, createRuntimeApp, withTestHost } from './app.js'

const bindings = env as Record<string, string | undefined>
const number = (name: string) => (bindings[name] === undefined ? undefined : Number(bindings[name]))
const options: RuntimeAppOptions = {
  issuer: bindings.ISSUER,
  userinfoEndpoint: bindings.USERINFO_ENDPOINT,
  oauthTimeoutMs: number('OAUTH_TIMEOUT_MS'),
  jwtIssuer: bindings.JWT_ISSUER,
  jwksUrl: bindings.JWKS_URL,
  jwksMaxAgeMs: number('JWKS_MAX_AGE_MS'),
  lastUsedFlushMs: number('LAST_USED_FLUSH_MS'),
  sessionTtlMs: number('SESSION_TTL_MS'),
}
// Undefined options are left out, so the library's defaults apply.
for (const key of Object.keys(options) as Array<keyof RuntimeAppOptions>) if (options[key] === undefined) delete options[key]

const platform = createRuntimeApp(lib, web, options)
const waitingPlatform = createRuntimeApp(lib, web, { ...options, waitUntil })

export default {
  fetch(request: Request): Promise<Response> {
    const chosen = request.headers.get('x-test-variant') === 'wait-until' ? waitingPlatform : platform
    // workerd sets no client address of its own (Cloudflare's edge sends CF-Connecting-IP).
    return chosen.serve(withTestHost(request), request.headers.get('cf-connecting-ip') ?? undefined)
  },
}
