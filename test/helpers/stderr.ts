/**
 * What the default `onError` (`logError`) and the OAuth validator's default logger write while
 * a test runs: their lines on stderr (`console.error`), captured instead of printed.
 */
import { vi } from 'vitest'

/** The lines written to `console.error` while `run` ran. */
export async function written(run: () => Promise<void>): Promise<string[]> {
  const lines: string[] = []
  const spy = vi.spyOn(console, 'error').mockImplementation((line: unknown) => void lines.push(String(line)))
  try {
    await run()
  } finally {
    spy.mockRestore()
  }
  return lines
}
