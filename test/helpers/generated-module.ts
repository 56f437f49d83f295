import { mkdirSync, writeFileSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const dir = fileURLToPath(new URL('../.generated/', import.meta.url))

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
