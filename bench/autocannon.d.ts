// The part of autocannon's API the load generator uses (the package ships no types).
declare module 'autocannon' {
  interface Histogram {
    min: number
    max: number
    average: number
    mean: number
    stddev: number
    total: number
    p50: number
    p90: number
    p97_5: number
    p99: number
  }
  interface Options {
    url: string
    connections?: number
    duration?: number
    pipelining?: number
    method?: string
    headers?: Record<string, string>
    body?: string
    workers?: number
    /** Total requests to send, instead of a duration. */
    amount?: number
    /** Seconds before a request counts as timed out. */
    timeout?: number
    /** The body every response must have; others are counted in `mismatches`. */
    expectBody?: string
  }
  export interface Result {
    requests: Histogram
    latency: Histogram
    throughput: Histogram
    duration: number
    errors: number
    timeouts: number
    non2xx: number
    mismatches?: number
    statusCodeStats?: Record<string, { count: number | string }>
  }
  function autocannon(options: Options): Promise<Result>
  export default autocannon
}
