import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = new URL('../../', import.meta.url)
const dir = fileURLToPath(new URL('test/.generated/', root))

/**
 * The code blocks tagged `language` (```ts by default) of the project's Markdown `file`
 * (`docs/adapters.md`) from the line `from` to the line `to` (the next heading, say; the end of
 * the page without it); a heading not on the page throws, so a renamed section fails its test
 * instead of testing nothing.
 */
export function codeBlocks(file: string, from: string, to?: string, language = 'ts'): string[] {
  const page = readFileSync(new URL(file, root), 'utf8')
  const start = page.indexOf(from)
  const end = to === undefined ? page.length : page.indexOf(to, start)
  if (start < 0 || end < 0) throw new Error(`${file} has no ${start < 0 ? from : to}`)
  return [...page.slice(start, end).matchAll(new RegExp('```' + language + '\\n([\\s\\S]*?)```', 'g'))].map((m) => m[1]!)
}

/**
 * `source` written to test/.generated/`name`.ts and imported: a docs sample as a module of its
 * own, as a reader copies it (its imports of `mcp-dispatch` resolve as the tests' do).
 */
export async function importGenerated<T>(name: string, source: string): Promise<T> {
  mkdirSync(dir, { recursive: true })
  const file = `${dir}${name}.ts`
  writeFileSync(file, source)
  return (await import(/* @vite-ignore */ file)) as T
}

/**
 * The one ```ts block of `file` from `from` to `to` (as {@link codeBlocks} takes them), imported
 * as the module `name`; throws unless there is exactly one, so a sample split or gone fails.
 */
export async function importBlock<T>(name: string, file: string, from: string, to?: string): Promise<T> {
  const blocks = codeBlocks(file, from, to)
  if (blocks.length !== 1) throw new Error(`${file} has ${blocks.length} ts blocks from "${from}", not one`)
  return importGenerated<T>(name, blocks[0]!)
}
