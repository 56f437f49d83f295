/**
 * `text` without its trailing `/`s, in one pass from the end. `/\/+$/` takes time quadratic in
 * the number of slashes that are not trailing (64,000 before an `x`: 1.8 s), and these are
 * options an operator may load from anywhere.
 */
export function withoutTrailingSlashes(text: string): string {
  let end = text.length
  while (end > 0 && text.charCodeAt(end - 1) === 0x2f) end--
  return end === text.length ? text : text.slice(0, end)
}
