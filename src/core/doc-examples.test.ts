/**
 * The `@example` blocks of the core's doc comments, run: what an example shows after `//` is
 * what the package answers. docs/pipeline.md promises an example for every pure function in
 * the package's types, and an example that drifted from the code would mislead more than none.
 *
 * A block is run line by line with the root entry's exports, and its file's, in scope: `const` lines declare,
 * and a line `expression // value` (or an expression whose next line is that comment) is
 * checked: the value is the comment when it is an expression, else its longest start that is a
 * literal or a call (`null: every address allowed` checks `null`), `throws Name: message` checks the error (a
 * message ending in `…` is a start), and a reply's two comment lines (`{ status, headers,` and
 * `body: '…' }`) check the whole reply. A block holding any other line (one naming a variable
 * of the reader's, as `header`) is left out only when UNCHECKED names it, and the count of
 * checked lines is held up, so a change to the format cannot quietly check nothing.
 */
import { readFileSync, readdirSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { describe, expect, it } from 'vitest'
import * as api from '../index.js'

const dir = fileURLToPath(new URL('.', import.meta.url))
const sources = readdirSync(dir).filter((name) => name.endsWith('.ts') && !name.endsWith('.test.ts')).sort()

/** The `@example` code blocks of a source file, their ` * ` margin removed. */
function exampleBlocks(source: string): string[][] {
  const blocks: string[][] = []
  for (const doc of source.match(/\/\*\*[\s\S]*?\*\//g) ?? []) {
    const lines = doc.split('\n').map((line) => line.replace(/^\s*\* ?/, ''))
    for (let i = 0; i < lines.length; i++) {
      if (lines[i] !== '@example' || !lines[i + 1]?.startsWith('```')) continue
      const end = lines.indexOf('```', i + 2)
      if (end !== -1) blocks.push(lines.slice(i + 2, end))
    }
  }
  return blocks
}

/** TypeScript-only syntax of the examples, removed: `as Type` and non-null `!`. */
function asJavaScript(code: string): string {
  return code.replace(/\s+as\s+[A-Z]\w*/g, '').replace(/\)!(?!=)/g, ')')
}

/** Whether `text` is a JavaScript expression (it compiles; nothing is run). */
function isExpression(text: string): boolean {
  try {
    new Function(`return (${text})`)
    return true
  } catch {
    return false
  }
}

/**
 * What the comment after a line says it answers: the whole comment when it is an expression
 * (`ALLOW_HEADERS + ', mcp-param-region'`, run in the block's scope), else its longest start
 * that is a literal (`null: every address allowed`). `undefined` when neither, or when the
 * value is elided (`'svc_3xK…'`).
 */
function expectedValue(comment: string): string | undefined {
  const candidates: string[] = [comment.trim()]
  for (let end = comment.length - 1; end > 0; end--) {
    if (/[\s:(,]/.test(comment[end]!)) candidates.push(comment.slice(0, end).trim())
  }
  for (const [index, text] of candidates.entries()) {
    if (text === '' || text.includes('…') || !isExpression(text)) continue
    // Past the whole comment, a word must be a literal or a call: `true only for…` is `true`.
    if (index > 0 && /^[A-Za-z_$]/.test(text) && !/^(true|false|null|undefined)$|\)$/.test(text)) continue
    return text
  }
  return undefined
}

type Scope = Readonly<Record<string, unknown>>
type Check = { line: string; run: (scope: Scope) => void }

/** A block's checks, or `null` when a line is neither a declaration nor a checkable line. */
function compile(block: readonly string[]): Check[] | null {
  const statements: string[] = []
  const checks: Check[] = []
  for (let i = 0; i < block.length; i++) {
    const line = block[i]!.trim()
    if (line === '') continue
    const inline = /^(.*?\S)\s+\/\/ (.*)$/.exec(line)
    if (line.startsWith('const ')) {
      const statement = asJavaScript(inline ? inline[1]! : line)
      statements.push(statement)
      // `const start = windowStart(now, WINDOWS.minute) // 1_700_000_100_000` checks `start`.
      const expected = inline ? expectedValue(inline[2]!) : undefined
      const name = /^const (\w+) =/.exec(statement)?.[1]
      if (expected !== undefined && name !== undefined) {
        const declared = statements.slice()
        checks.push({ line, run: (scope) => expect(evaluate(scope, declared, name), line).toEqual(evaluate(scope, declared, expected)) })
      }
      continue
    }
    let expression: string
    let comment: string
    if (inline && !inline[1]!.startsWith('//')) {
      expression = inline[1]!
      comment = inline[2]!
    } else if (!line.startsWith('//') && block[i + 1]?.trim().startsWith('// ')) {
      expression = line
      comment = block[++i]!.trim().slice(3)
      while (block[i + 1]?.trim().startsWith('//   ')) comment += ' ' + block[++i]!.trim().slice(5)
    } else {
      return null
    }
    const code = asJavaScript(expression)
    const declared = statements.slice()
    const thrown = /^throws (\w+)(?:: (.*))?$/.exec(comment)
    if (thrown) {
      const [, name, message] = thrown
      checks.push({ line, run: (scope) => {
        let error: unknown
        try {
          evaluate(scope, declared, code)
        } catch (caught) {
          error = caught
        }
        expect(error, line).toBeInstanceOf(Error)
        expect((error as Error).name, line).toBe(name)
        if (message === undefined) return
        const start = message.endsWith('…') ? message.slice(0, -1) : undefined
        if (start !== undefined) expect((error as Error).message.slice(0, start.length), line).toBe(start)
        else expect((error as Error).message, line).toBe(message)
      } })
      continue
    }
    const expected = expectedValue(comment)
    if (expected === undefined) return null
    checks.push({ line, run: (scope) => expect(evaluate(scope, declared, code), line).toEqual(evaluate(scope, declared, expected)) })
  }
  return checks.length > 0 ? checks : null
}

/** Runs the block's declarations before the line, then answers `code`, with `scope` in scope. */
function evaluate(scope: Scope, statements: readonly string[], code: string): unknown {
  const names = Object.keys(scope)
  return new Function(...names, `${statements.join('\n')}\nreturn (${code})`)(...names.map((name) => scope[name]))
}

/**
 * The examples that show usage rather than answers (a reader's variables, prose after `//`),
 * by their first line: every other block must be checked, so one that stops parsing (a line
 * of a new shape) fails here rather than being dropped.
 */
const UNCHECKED = [
  "api-token.ts: const parsed = parseApiToken(header.slice(7))",
  "api-token.ts: hashApiToken('svc_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh')          // SHA-256, 64 hex digits",
]

describe('the core\'s doc-comment examples show what the package answers', () => {
  let checked = 0
  const unchecked: string[] = []
  for (const file of sources) {
    const blocks = exampleBlocks(readFileSync(dir + file, 'utf8')).flatMap((block) => {
      const checks = compile(block)
      if (checks === null) unchecked.push(`${file}: ${block.find((line) => line.trim() !== '')?.trim()}`)
      return checks === null ? [] : [checks]
    })
    if (blocks.length === 0) continue
    it(file, async () => {
      // The root entry's exports, and the file's own (some examples show internal helpers).
      const scope: Scope = { ...api, ...(await import(/* @vite-ignore */ `./${file.replace(/\.ts$/, '.js')}`) as Scope) }
      for (const check of blocks.flat()) {
        check.run(scope)
        checked++
      }
    })
  }
  it('checks every example but those that show usage, and the lines of every pure function the docs list', () => {
    expect(unchecked).toEqual(UNCHECKED)
    // Runs after the files' tests (vitest runs a describe's tests in order).
    expect(checked).toBeGreaterThanOrEqual(74)
  })
})
