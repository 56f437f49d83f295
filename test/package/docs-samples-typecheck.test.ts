/**
 * The code samples of README.md and docs/*.md typecheck against the built package, as a
 * user's project sees it: `mcp-dispatch` and its subpaths resolve through the `exports` map of
 * package.json to the declarations in `dist/` (a package may import itself by its name), not
 * to `src/` as the repository's own `paths` would have it. Every ```ts, ```typescript and
 * ```js block is one module of a single TypeScript program, under the compiler options of
 * tsconfig.json. The samples that import `ioredis` (ioredis 6) are checked once more against
 * ioredis 5 (the dev dependency `ioredis5`), the other major the peer dependency takes.
 *
 * A sample that is a fragment uses names declared elsewhere (`app`, `dispatcher`, `tokens`…):
 * its context below declares them, with their real types, before the sample (and may close a
 * function around it after). A context names its sample by a piece of text found in that
 * sample only, so the docs carry no annotations; one that matches no sample fails the test.
 * Blocks in another language are skipped by their tag (SKIPPED_LANGUAGES, each with its
 * reason); an untagged block or an unknown tag fails, so a TypeScript sample is never skipped
 * for want of a tag. A TypeScript block that cannot be checked would need a context with
 * `skip` and its reason; none does.
 *
 * Checks `dist/`, as test/package/exports.test.ts does (test/global-setup.ts builds it when it is
 * missing). After a change to `src/`, build again: `dist/` is what is checked.
 */
import { existsSync, readFileSync, readdirSync } from 'node:fs'
import { join, resolve } from 'node:path'
import ts from 'typescript'
import { describe, expect, it } from 'vitest'
import { underCI } from '../helpers/ci.js'

const root = resolve(import.meta.dirname, '../..')
const built = existsSync(join(root, 'dist/index.d.ts'))
if (!built && underCI()) throw new Error('dist/ is missing: CI must run `npm run build` before the tests')
if (!built) console.warn('[docs-samples-typecheck.test] skipped: run `npm run build` first')

/** Fence tags of blocks checked, and the extension their module gets. */
const CHECKED_LANGUAGES: Readonly<Record<string, 'ts' | 'js'>> = { ts: 'ts', typescript: 'ts', js: 'js' }

/** Fence tags of blocks that are not TypeScript, and why they are not checked. */
const SKIPPED_LANGUAGES: Readonly<Record<string, string>> = {
  sh: 'shell commands',
  json: 'data (the platform seed), not code',
  sql: 'SQL for PostgreSQL: the retention DELETE of docs/stores.md is run as written by test/stores/postgres.test.ts',
  nginx: 'configuration of a reverse proxy in front (docs/adapters.md), not code',
}

interface Sample {
  readonly file: string
  /** Line of the block's first code line, 1-based. */
  readonly line: number
  readonly language: string
  readonly code: string
}

/** Fenced code blocks of a Markdown file, list-item indentation removed. */
function extractSamples(file: string): Sample[] {
  const lines = readFileSync(join(root, file), 'utf8').split('\n')
  const samples: Sample[] = []
  for (let i = 0; i < lines.length; i++) {
    const open = /^( *)(`{3,})\s*([^\s`]*)/.exec(lines[i]!)
    if (!open) continue
    const indent = open[1]!.length
    const fence = open[2]!
    const isClose = (line: string) => line.trim().startsWith(fence) && /^`+$/.test(line.trim())
    const body: string[] = []
    let j = i + 1
    for (; j < lines.length && !isClose(lines[j]!); j++) {
      const line = lines[j]!
      body.push(line.slice(Math.min(indent, line.length - line.trimStart().length)))
    }
    samples.push({ file, line: i + 2, language: open[3]!, code: body.join('\n') })
    i = j
  }
  return samples
}

/** What a fragment assumes: declarations before it, and code after it that closes a function it sits in. */
interface SampleContext {
  readonly file: string
  /** Text found in exactly one sample of `file`: the sample this context belongs to. */
  readonly marker: string
  readonly prelude?: string
  readonly postlude?: string
  /** Why the sample is not checked at all (none is, today). */
  readonly skip?: string
}

const STORES = `import type { AppStore, SubscriptionStore, TokenService } from 'mcp-dispatch'
declare const apps: AppStore
declare const subscriptions: SubscriptionStore
declare const tokens: TokenService`
const DISPATCHER = `import type { Dispatcher } from 'mcp-dispatch'
declare const dispatcher: Dispatcher`
/** The platform's own function that makes the MCP server of an App version. */
const BUILD_SERVER = `import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import type { AppRecord } from 'mcp-dispatch'
declare function buildServer(app: AppRecord, version: string): McpServer`
/** `nodeSessions` of docs/adapters.md, as that doc defines it. */
const NODE_SESSIONS = `import type { IncomingMessage, ServerResponse } from 'node:http'
declare function nodeSessions(build: () => McpServer): (req: IncomingMessage, res: ServerResponse, body?: unknown) => Promise<void>`

const contexts: readonly SampleContext[] = [
  {
    file: 'docs/adapters.md',
    marker: 'getRequestListener(app.fetch',
    prelude: `import type { Hono } from 'hono'
declare const app: Hono`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'webSessions(() => buildServer(app, version))',
    prelude: `${STORES}
${BUILD_SERVER}
declare function webSessions(build: () => McpServer): (request: Request) => Promise<Response>`,
  },
  {
    // A Next.js route handler (app/[[...path]]/route.ts).
    file: 'docs/adapters.md',
    marker: 'kept.mcpDispatch ??= mcpDispatch(',
    prelude: `${STORES}
${BUILD_SERVER}
declare function webSessions(build: () => McpServer): (request: Request) => Promise<Response>`,
  },
  {
    // Bun's and Deno's globals, as far as the sample uses them.
    file: 'docs/adapters.md',
    marker: 'Bun.serve',
    prelude: `import type { WebDispatchHandler } from 'mcp-dispatch/web'
declare const handle: WebDispatchHandler
declare const Bun: { serve(options: { fetch(request: Request, server: { requestIP(request: Request): { address: string } | null }): Promise<Response> }): unknown }
declare const Deno: { serve(handler: (request: Request, info: { remoteAddr: { hostname: string } }) => Promise<Response>): unknown }`,
  },
  {
    // The Expect: 100-continue wiring, one server per framework.
    file: 'docs/adapters.md',
    marker: "server.on('checkContinue'",
    prelude: `import * as http from 'node:http'
import { serve } from '@hono/node-server'
import type { Express } from 'express'
import type { FastifyInstance } from 'fastify'
import type { WebDispatchHandler } from 'mcp-dispatch/web'
declare const app: Express
declare const fastify: FastifyInstance
declare const handle: WebDispatchHandler`,
  },
  {
    file: 'docs/adapters.md',
    marker: "from 'cloudflare:workers'",
    prelude: `import type { AppStore, SubscriptionStore, TokenStore } from 'mcp-dispatch'
import type { WebMcpHandler } from 'mcp-dispatch/web'
declare const tokenStore: TokenStore
declare const apps: AppStore
declare const subscriptions: SubscriptionStore
declare const mcpHandlers: Record<string, WebMcpHandler>`,
  },
  { file: 'docs/adapters.md', marker: "app.disable('x-powered-by')", prelude: `${DISPATCHER}\n${BUILD_SERVER}\n${NODE_SESSIONS}` },
  { file: 'docs/adapters.md', marker: 'await mcp.register(mcpDispatch({ dispatcher }))', prelude: `${DISPATCHER}\n${BUILD_SERVER}\n${NODE_SESSIONS}` },
  {
    file: 'docs/adapters.md',
    marker: 'frameworkErrors: (error: FastifyError',
    prelude: `import type { TokenApi } from 'mcp-dispatch'
declare const api: TokenApi`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'app.getDefaultJsonParser',
    prelude: `import type { FastifyInstance } from 'fastify'
declare const app: FastifyInstance`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'routeByVersion((app, version) => handlerFor(app, version))',
    prelude: `import { routeByVersion, type WebMcpHandler } from 'mcp-dispatch/web'
import type { AppRecord } from 'mcp-dispatch'
declare function handlerFor(app: AppRecord, version: string): WebMcpHandler
declare const v1: WebMcpHandler
declare const v2: WebMcpHandler`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'createProxyHandler({',
    prelude: `${DISPATCHER}
import type { IdentityKey } from 'mcp-dispatch/proxy'
declare const privateKey: IdentityKey`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'fromWebHandler(proxy)) // no body parser',
    prelude: `${DISPATCHER}
import type { ProxyHandler } from 'mcp-dispatch/proxy'
import type { Express } from 'express'
declare const app: Express
declare const proxy: ProxyHandler`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'removeAllContentTypeParsers',
    prelude: `import type { ProxyHandler } from 'mcp-dispatch/proxy'
import type { FastifyInstance } from 'fastify'
declare const app: FastifyInstance
declare const proxy: ProxyHandler`,
  },
  { file: 'docs/adapters.md', marker: 'createIdentityVerifier({', prelude: 'declare const request: Request' },
  {
    // A fragment of an Express route handler.
    file: 'docs/adapters.md',
    marker: 'identity = await verifyIdentity(req)',
    prelude: `import type { Request as ExpressRequest, Response as ExpressResponse } from 'express'
import { JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
import type { IdentityVerifier, VerifiedIdentity } from 'mcp-dispatch/proxy'
declare const verifyIdentity: IdentityVerifier
export async function handle(req: ExpressRequest, res: ExpressResponse) {
let identity: VerifiedIdentity`,
    postlude: `return identity
}`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'await signer.jwks() // rejects',
    prelude: `import { createIdentitySigner, type IdentityKey } from 'mcp-dispatch/proxy'
declare const privateKey: IdentityKey`,
  },
  {
    file: 'docs/adapters.md',
    marker: 'previousKeys: [{ jwk',
    prelude: `import { exportJWK } from 'jose'
import { createIdentitySigner, type IdentityKey } from 'mcp-dispatch/proxy'
declare const newKey: IdentityKey
declare const oldPublicKey: CryptoKey`,
  },
  { file: 'docs/api-tokens.md', marker: 'generateApiToken()', prelude: 'declare const pepper: string' },
  {
    // express-session in front of serveTokenApi.
    file: 'docs/api-tokens.md',
    marker: "import session from 'express-session'",
    prelude: `import type { Express } from 'express'
import type { TokenService } from 'mcp-dispatch'
declare const app: Express
declare const secret: string
declare const tokens: TokenService`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: "console.log(created.token)",
    prelude: `import type { AppStore, SubscriptionStore } from 'mcp-dispatch'
declare const apps: AppStore
declare const subscriptions: SubscriptionStore`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: 'previousPeppers: [null]',
    prelude: `import { createTokenService, type AppStore, type SubscriptionStore, type TokenStore } from 'mcp-dispatch'
declare const store: TokenStore
declare const apps: AppStore
declare const subscriptions: SubscriptionStore`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: 'readDashboardCookie',
    prelude: `import type { TokenApiSession, TokenService } from 'mcp-dispatch'
declare const tokens: TokenService
declare function readDashboardCookie(request: Request): TokenApiSession | null
declare function checkCsrfHeader(request: Request, session: TokenApiSession): boolean
declare const request: Request
declare const clientAddress: string | undefined
declare function notFound(): Response`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: 'app.use(serveTokenApi(api))',
    prelude: `import type { TokenApi } from 'mcp-dispatch'
import type { Express } from 'express'
declare const app: Express
declare const api: TokenApi`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: 'app.register(serveTokenApi(api))',
    prelude: `import type { TokenApi } from 'mcp-dispatch'
import type { FastifyInstance } from 'fastify'
declare const app: FastifyInstance
declare const api: TokenApi`,
  },
  {
    file: 'docs/api-tokens.md',
    marker: "hosts: ['dashboard.example.com']",
    prelude: `import type { TokenApiSession, TokenService } from 'mcp-dispatch'
declare const tokens: TokenService
declare function authenticateSession(request: Request): Promise<TokenApiSession | null>
declare function verifyCsrf(request: Request, session: TokenApiSession): boolean`,
  },
  { file: 'docs/oauth.md', marker: "oauth: createOAuthValidator({ issuer: 'https://auth.example.com' }),", prelude: STORES },
  {
    file: 'docs/oauth.md',
    marker: "mode: 'jwt', audience",
    prelude: `${STORES}
import { createDispatcher, createOAuthValidator } from 'mcp-dispatch'
declare const issuer: string`,
  },
  {
    // The reference platform, from the repository root (docs/platform.md).
    file: 'docs/oauth.md',
    marker: 'createPlatform({ seed, authorizationServer',
    prelude: `import { createPlatform, type PlatformSeed } from './examples/platform/index.js'
declare const seed: PlatformSeed`,
  },
  {
    // Written inside bench/stores.ts, as the doc says.
    file: 'docs/performance.md',
    marker: 'registerStoreSet',
    prelude: `import { registerStoreSet } from './bench/stores.js'
import type { AppStore, RateLimitStore, SessionStore, SubscriptionStore, TokenStore } from 'mcp-dispatch'
declare function connect(url: string | undefined): Promise<{ close(): Promise<void> }>
declare const apps: AppStore
declare const subscriptions: SubscriptionStore
declare const tokens: TokenStore
declare const sessions: SessionStore
declare const rateLimit: RateLimitStore`,
  },
  {
    file: 'docs/platform.md',
    marker: 'createPlatform',
    prelude: `import type { PlatformSeed } from './examples/platform/index.js'
declare const seed: PlatformSeed
declare const clock: number`,
  },
  {
    file: 'docs/stores.md',
    marker: 'createRedisCacheStore<CachedValidation>',
    prelude: `import type { AppRecord, AppStore, Identity, RateLimitPolicy, SubscriptionStore, TokenStore } from 'mcp-dispatch'
declare const tokenStore: TokenStore
declare const apps: AppStore
declare const subscriptions: SubscriptionStore
declare const issuer: string
declare function policy(identity: Identity, app: AppRecord): RateLimitPolicy | undefined
declare const log: { warn(message: string, error: unknown): void }`,
  },
  {
    file: 'docs/stores.md',
    marker: 'scanBufferStream',
    prelude: `import type { Redis } from 'ioredis'
declare const redis: Redis`,
  },
  {
    file: 'docs/stores.md',
    marker: 'createPostgresTokenStore({ pool',
    prelude: `import type { AppStore, SubscriptionStore } from 'mcp-dispatch'
declare const apps: AppStore
declare const subscriptions: SubscriptionStore
declare const log: { warn(message: string, error: unknown): void }`,
  },
]

const files = ['README.md', ...readdirSync(join(root, 'docs')).filter((f) => f.endsWith('.md')).sort().map((f) => `docs/${f}`)]
const samples = files.flatMap(extractSamples)

/** The project's compiler options, without its `paths` to `src/`: imports of the package go through its exports. */
function compilerOptions(): ts.CompilerOptions {
  const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile)
  const { options, errors } = ts.parseJsonConfigFileContent(config.config, ts.sys, root)
  expect(errors.map((e) => ts.flattenDiagnosticMessageText(e.messageText, '\n'))).toEqual([])
  delete options.paths
  delete options.baseUrl
  return { ...options, noEmit: true, allowJs: true, checkJs: true }
}

/**
 * The errors of one TypeScript program made of `selected` (each with its context), the
 * package resolved through its exports to `dist/`; `rewrite` changes a sample's code first.
 */
function typecheck(selected: readonly Sample[], rewrite: (code: string) => string = (code) => code, strictest = false): string[] {
  const options = { ...compilerOptions(), ...(strictest && { exactOptionalPropertyTypes: true, noUncheckedIndexedAccess: true }) }
  const modules = new Map<string, { sample: Sample; text: string; preludeLines: number }>()
  for (const sample of selected) {
    const extension = CHECKED_LANGUAGES[sample.language]
    if (extension === undefined) continue
    const context = contexts.find((c) => c.file === sample.file && sample.code.includes(c.marker))
    if (context?.skip !== undefined) continue
    const prelude = context?.prelude === undefined ? '' : `${context.prelude}\n`
    const postlude = context?.postlude === undefined ? '' : `\n${context.postlude}`
    // At the repository root, so a sample of the reference platform imports './examples/…';
    // `export {}` makes each sample a module of its own.
    const name = join(root, `docs-sample-${sample.file.replace(/[/.]/g, '-')}-${sample.line}.${extension}`)
    modules.set(name, { sample, text: `${prelude}${rewrite(sample.code)}${postlude}\nexport {}\n`, preludeLines: prelude.split('\n').length - 1 })
  }

  const host = ts.createCompilerHost(options)
  const { getSourceFile, fileExists, readFile } = host
  host.getSourceFile = (fileName, languageVersion, ...rest) => {
    const module = modules.get(fileName)
    return module ? ts.createSourceFile(fileName, module.text, languageVersion, true) : getSourceFile.call(host, fileName, languageVersion, ...rest)
  }
  host.fileExists = (fileName) => modules.has(fileName) || fileExists.call(host, fileName)
  host.readFile = (fileName) => modules.get(fileName)?.text ?? readFile.call(host, fileName)
  // The Workers sample imports workerd's `cloudflare:workers` (users get its types from
  // @cloudflare/workers-types): the names it uses, as the runtime suites declare them.
  const program = ts.createProgram([...modules.keys(), join(root, 'test/runtimes/cloudflare-workers.d.ts')], options, host)

  // The package resolved as a user's project resolves it: to the built declarations.
  expect(program.getSourceFile(join(root, 'dist/index.d.ts')), 'mcp-dispatch must resolve to dist/index.d.ts').toBeDefined()
  expect(program.getSourceFile(join(root, 'src/index.ts'))).toBeUndefined()

  const where = (diagnostic: ts.Diagnostic): string => {
    const module = diagnostic.file && modules.get(diagnostic.file.fileName)
    if (!diagnostic.file || diagnostic.start === undefined) return diagnostic.file?.fileName ?? '(program)'
    const { line } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start)
    if (!module) return `${diagnostic.file.fileName}:${line + 1}`
    const { sample, preludeLines } = module
    if (line < preludeLines) return `${sample.file}:${sample.line} (its context in docs-samples-typecheck.test.ts, line ${line + 1})`
    return `${sample.file}:${sample.line + line - preludeLines}`
  }
  const diagnostics = [
    ...program.getOptionsDiagnostics(),
    ...program.getGlobalDiagnostics(),
    ...[...modules.keys()].flatMap((name) => {
      const file = program.getSourceFile(name)!
      return [...program.getSyntacticDiagnostics(file), ...program.getSemanticDiagnostics(file)]
    }),
  ]
  return diagnostics.map((d) => `${where(d)}: TS${d.code} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`)
}

describe.runIf(built)('README and docs samples', () => {
  it('tags every fenced block with a language this test knows', () => {
    const unknown = samples
      .filter((s) => !(s.language in CHECKED_LANGUAGES) && !(s.language in SKIPPED_LANGUAGES))
      .map((s) => `${s.file}:${s.line - 1}: ${s.language === '' ? 'no language tag' : `tag "${s.language}"`}`)
    expect(unknown, 'tag the block (ts, sh, json…), or list its language in SKIPPED_LANGUAGES with the reason').toEqual([])
  })

  it('names each sample with one context at most, and every context names a sample', () => {
    for (const context of contexts) {
      const matching = samples.filter((s) => s.file === context.file && s.code.includes(context.marker))
      expect(matching.length, `context ${context.file} "${context.marker}" must match exactly one sample`).toBe(1)
    }
    for (const sample of samples) {
      const matching = contexts.filter((c) => c.file === sample.file && sample.code.includes(c.marker))
      expect(matching.length, `${sample.file}:${sample.line} is named by more than one context`).toBeLessThanOrEqual(1)
    }
  })

  it('typechecks every TypeScript sample against the built package', { timeout: 60_000 }, () => {
    expect(typecheck(samples), 'a sample that does not typecheck: fix the sample (or the context it needs, above); dist/ must be built from the current src/').toEqual([])
  })

  it('typechecks every TypeScript sample under exactOptionalPropertyTypes and noUncheckedIndexedAccess too: an option may be given undefined (an unset variable)', { timeout: 60_000 }, () => {
    expect(typecheck(samples, undefined, true), 'a sample that does not typecheck in a project this strict: options must take `undefined` where they may be left out').toEqual([])
  })

  it('under exactOptionalPropertyTypes, what a platform builds (token inputs, App seeds, error bodies, outcomes) and implements (buses, session stores, validators, token stores, Redis clients) takes undefined where a field may be left out', { timeout: 60_000 }, () => {
    // Regression: these refused `{ name: body.name }` with `body.name: string | undefined`
    // (TS2375), though the library treats undefined as left out.
    const code = `
import type { AccessTokenContext, AccessTokenInfo, AccessTokenValidator, CreateTokenInput, DispatchOutcome, Identity, InvalidationBus, JsonRpcErrorObject, MemoryAppSeed, SessionStore, TokenApiRequestInfo, TokenStore, UpdateTokenInput } from 'mcp-dispatch'
import type { RedisCommandClient, RedisSubscriberClient } from 'mcp-dispatch/redis'
declare function maybe<T>(): T | undefined
declare const store: SessionStore
declare const bus: InvalidationBus
declare const validator: AccessTokenValidator
declare const tokenStore: TokenStore
declare const redis: RedisCommandClient
declare const redisSubscriber: RedisSubscriberClient
const update: UpdateTokenInput = { name: maybe<string>(), expiresAt: maybe<number>(), allowedIps: maybe<string[]>() }
const create: CreateTokenInput = { userId: 'u', name: 'n', servers: ['a'], expiresInDays: 30, allowedIps: maybe<string[]>() }
const seed: MemoryAppSeed = { id: 'a', slug: 's', name: 'n', versions: maybe<string[]>() }
const mine: SessionStore = { ...store, synchronous: maybe<boolean>() }
const myBus: InvalidationBus = { ...bus, listening: maybe<boolean>(), publishTimeoutMs: maybe<number>() }
const myValidator: AccessTokenValidator = { validate: validator.validate, issuer: maybe<string>(), checksAppAddress: maybe<boolean>() }
const info: AccessTokenInfo = { subject: 's', clientId: maybe<string>(), scopes: maybe<string[]>(), expiresAt: maybe<number>() }
const context: AccessTokenContext = { resource: 'https://a.example', appId: 'a', clientAddress: maybe<string>() }
const identity: Identity = { subject: 's', method: 'oauth', tokenId: maybe<string>(), clientId: maybe<string>(), scopes: maybe<string[]>() }
const outcome: DispatchOutcome = { status: 200, sessionId: undefined, whenClosed: maybe<(listener: () => void) => void>(), close: maybe<() => void>(), contentType: maybe<string>() }
const error: JsonRpcErrorObject = { code: -32000, message: 'm', data: maybe<Record<string, unknown>>() }
const requestInfo: TokenApiRequestInfo = { frameworkRequest: maybe<object>() }
// A store wrapping another (metrics, deadlines) passes its optional method on as it finds it.
const wrapped: TokenStore = { ...tokenStore, countActiveByUser: tokenStore.countActiveByUser }
const redisClient: RedisCommandClient = { call: redis.call, status: maybe<string>() }
const subscriber: RedisSubscriberClient = { ...redisSubscriber, status: maybe<string>() }
export { update, create, seed, mine, myBus, myValidator, info, context, identity, outcome, error, requestInfo, wrapped, redisClient, subscriber }
`
    expect(typecheck([{ file: 'exact-optional', line: 1, language: 'ts', code }], undefined, true)).toEqual([])
  })

  it('typechecks the samples that import ioredis against ioredis 5 too (the dev dependency ioredis5)', { timeout: 60_000 }, () => {
    const onIoredis = samples.filter((sample) => sample.code.includes("from 'ioredis'"))
    expect(onIoredis.length).toBeGreaterThan(0)
    const errors = typecheck(onIoredis, (code) => code.replaceAll("from 'ioredis'", "from 'ioredis5'"))
    expect(errors, 'a sample that does not typecheck with ioredis 5: the stores must take its client as they take ioredis 6').toEqual([])
  })
})
