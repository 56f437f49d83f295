/**
 * A project that emits declarations (`declaration: true`: a library, a monorepo's packages under
 * project references) must be able to name every type it infers from the package's public
 * types: a type of no entry point, reached only through an alias, is TS2742 ("cannot be named
 * without a reference to …/dist/<chunk>.js") there. The project sits outside the package and
 * finds it in its `node_modules`, as a user's does; checks `dist/`, as
 * test/package/exports.test.ts does (after a change to `src/`, build again).
 */
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import ts from 'typescript'
import { afterAll, describe, expect, it } from 'vitest'
import { underCI } from '../helpers/ci.js'

const root = resolve(import.meta.dirname, '../..')
const built = existsSync(join(root, 'dist/index.d.ts'))
if (!built && underCI()) throw new Error('dist/ is missing: CI must run `npm run build` before the tests')
if (!built) console.warn('[declarations.test] skipped: run `npm run build` first')

describe.runIf(built)('declarations of a project using the package', () => {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-declarations-'))
  mkdirSync(join(dir, 'node_modules'))
  symlinkSync(root, join(dir, 'node_modules/mcp-dispatch'), 'dir')
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  /** The declaration errors (and any other) of `source`, as an ES module of a NodeNext project. */
  const declarationErrors = (source: string): string[] => {
    const file = join(dir, 'consumer.mts')
    writeFileSync(file, source)
    const options: ts.CompilerOptions = {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.NodeNext,
      moduleResolution: ts.ModuleResolutionKind.NodeNext,
      strict: true,
      declaration: true,
      emitDeclarationOnly: true,
      skipLibCheck: true,
      typeRoots: [join(root, 'node_modules/@types')],
      types: ['node'],
    }
    const program = ts.createProgram([file], options)
    const sourceFile = program.getSourceFile(file)!
    return [...program.getSemanticDiagnostics(sourceFile), ...program.getDeclarationDiagnostics(sourceFile)].map(
      (d) => `TS${d.code} ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`,
    )
  }

  it('names the options of every adapter\'s mcpDispatch in the declarations it emits (regression: the Express and Fastify ones were an alias of an interface of no entry point, TS2742)', { timeout: 60_000 }, () => {
    expect(
      declarationErrors(`
import * as express from 'mcp-dispatch/express'
import * as fastify from 'mcp-dispatch/fastify'
import * as web from 'mcp-dispatch/web'
import type { Dispatcher } from 'mcp-dispatch'
declare const dispatcher: Dispatcher
function withDefaults<T extends object>(options: T): T { return { ...options } }
export function expressOptions() { return withDefaults<express.ExpressDispatchOptions>({ dispatcher }) }
export function fastifyOptions() { return withDefaults<fastify.FastifyDispatchOptions>({ dispatcher }) }
export function webOptions() { return withDefaults<web.WebDispatchOptions>({ dispatcher, handler: () => new Response() }) }
`),
    ).toEqual([])
  })
})
