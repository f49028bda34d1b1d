/**
 * thermite's extension for Pi (@mariozechner/pi-coding-agent 0.73.1).
 *
 * Pi runs as agent-N, which can read none of the lane's files: every
 * built-in tool that touches files or runs commands (read, write, edit,
 * bash, ls, find, grep, and the user's `!cmd`) is replaced here by one
 * that acts through thermite's harness API, as the lane's user. The API is
 * HTTP over the unix socket THERMITE_API_SOCKET with the trial's token from
 * THERMITE_TOKEN_FILE (docs/trial-client.md):
 *
 *   - inside the workspace, files go through the trial's file helper
 *     (POST /v1/fs/read, write, stat, list, mkdir, find, grep);
 *   - elsewhere, and every command, go through POST /v1/exec, a command
 *     run as the lane in the workspace, so the kernel decides what the
 *     lane's user may read (EACCES shows as the tool's error).
 *
 * It adds the worker's research tools, the trial client's MCP tools of the
 * same names (research_note, research_fetch, research_read, research_list,
 * research_grep, research_find, step): calls of the same API, into the
 * run's research folder.
 *
 * Fail closed: with no socket or no token every tool is an error that says
 * so; nothing here ever touches the local file system on the model's
 * behalf. `thermite trial agent --harness pi` installs this file root-owned
 * and has Pi load it from agent-N's settings (docs/agents-pi.md).
 */

import * as fs from "node:fs";
import * as http from "node:http";
import * as path from "node:path";
import { Type } from "typebox";
import type {
	BashOperations,
	EditOperations,
	ExtensionAPI,
	FindOperations,
	LsOperations,
	ReadOperations,
	WriteOperations,
} from "@mariozechner/pi-coding-agent";
import {
	createBashToolDefinition,
	createEditToolDefinition,
	createFindToolDefinition,
	createGrepToolDefinition,
	createLsToolDefinition,
	createReadToolDefinition,
	createWriteToolDefinition,
	DEFAULT_MAX_BYTES,
	formatSize,
	truncateHead,
	truncateLine,
} from "@mariozechner/pi-coding-agent";

// ---------------------------------------------------------------------------
// The harness API.

/** The API's problem answer (RFC 9457), as far as a tool's error needs. */
interface Problem {
	detail?: string;
	code?: string;
	status?: number;
}

/** One NDJSON frame of an exec's answer (controller.ExecFrame). */
interface ExecFrame {
	stream?: "stdout" | "stderr";
	data?: string;
	data_b64?: string;
	done?: boolean;
	exit_code?: number;
	signal?: number;
	stopped?: string;
	truncated?: boolean;
	error?: string;
}

/** A lane command's outcome: its output and how it ended. */
interface ExecResult {
	stdout: Buffer;
	stderr: Buffer;
	last: ExecFrame;
}

/** The trial as GET /v1/trial gives it (controller.TrialInfo). */
interface TrialInfo {
	id: string;
	lane: number;
	workspace: string;
}

/** A refusal: the API's one line, or why the API cannot be reached. */
class ThermiteError extends Error {}

/** How this process reaches its trial's API: the socket and the token. */
interface Endpoint {
	socket: string;
	token: string;
}

let endpoint: Endpoint | undefined;

/** The socket and token from the environment, or a refusal naming what is missing. */
function apiEndpoint(): Endpoint {
	if (endpoint) return endpoint;
	const socket = process.env.THERMITE_API_SOCKET;
	const tokenFile = process.env.THERMITE_TOKEN_FILE;
	const how = "Pi's tools act only through thermite's harness API (`thermite trial agent TRIAL --harness pi`); refused";
	if (!socket) throw new ThermiteError(`thermite: THERMITE_API_SOCKET is not set: ${how}`);
	if (!tokenFile) throw new ThermiteError(`thermite: THERMITE_TOKEN_FILE is not set: ${how}`);
	let token: string;
	try {
		token = fs.readFileSync(tokenFile, "utf8").trim();
	} catch (err) {
		throw new ThermiteError(`thermite: the trial's token ${tokenFile}: ${(err as Error).message}: ${how}`);
	}
	if (!token) throw new ThermiteError(`thermite: the trial's token ${tokenFile} is empty: ${how}`);
	endpoint = { socket, token };
	return endpoint;
}

/** A request to the API; the answer's status and its body as it streams. */
function request(route: string, body: unknown, signal?: AbortSignal): Promise<http.IncomingMessage> {
	const { socket, token } = apiEndpoint();
	const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
	return new Promise((resolve, reject) => {
		const req = http.request(
			{
				socketPath: socket,
				path: route,
				method: payload ? "POST" : "GET",
				headers: {
					Authorization: `Bearer ${token}`,
					...(payload ? { "Content-Type": "application/json", "Content-Length": payload.length } : {}),
				},
				signal,
			},
			resolve,
		);
		req.on("error", (err) => {
			if (signal?.aborted) reject(new Error("aborted"));
			else reject(new ThermiteError(`thermite: the harness API at ${socket}: ${err.message}`));
		});
		req.end(payload);
	});
}

/** The whole body of an answer. */
function readAll(res: http.IncomingMessage): Promise<Buffer> {
	return new Promise((resolve, reject) => {
		const chunks: Buffer[] = [];
		res.on("data", (c: Buffer) => chunks.push(c));
		res.on("end", () => resolve(Buffer.concat(chunks)));
		res.on("error", reject);
	});
}

/** A refusal from a problem answer, as `thermite-trial` prints it: the API's line, its code and status. */
function refusal(status: number, body: Buffer): ThermiteError {
	let p: Problem = {};
	try {
		p = JSON.parse(body.toString("utf8"));
	} catch {
		p = { detail: body.toString("utf8").trim() };
	}
	const err = new ThermiteError(`${p.detail || `the harness API answered ${status}`} (${p.code ?? "error"}, ${status})`);
	(err as ThermiteError & { code?: string }).code = p.code;
	return err;
}

/** One JSON call of the API. */
async function call<T>(route: string, body?: unknown, signal?: AbortSignal): Promise<T> {
	const res = await request(route, body, signal);
	const data = await readAll(res);
	if (res.statusCode !== 200) throw refusal(res.statusCode ?? 0, data);
	return JSON.parse(data.toString("utf8")) as T;
}

/** The API's code of a refusal ("not_found", "denied", ...), if it has one. */
function codeOf(err: unknown): string | undefined {
	return (err as { code?: string })?.code;
}

/** A command run as the lane in the workspace (POST /v1/exec), its output streamed to onData. */
async function laneExec(
	argv: string[],
	opts: { cwd?: string; stdin?: Buffer; timeoutMs?: number; signal?: AbortSignal; onData?: (b: Buffer) => void } = {},
): Promise<ExecResult> {
	const body: Record<string, unknown> = { argv };
	if (opts.cwd) body.cwd = opts.cwd;
	if (opts.timeoutMs) body.timeout_ms = Math.ceil(opts.timeoutMs);
	if (opts.stdin) body.stdin_b64 = opts.stdin.toString("base64");
	const res = await request("/v1/exec", body, opts.signal);
	if (res.statusCode !== 200) throw refusal(res.statusCode ?? 0, await readAll(res));
	const out: Buffer[] = [];
	const errs: Buffer[] = [];
	let last: ExecFrame | undefined;
	let rest = "";
	const frame = (line: string) => {
		if (!line.trim()) return;
		const f = JSON.parse(line) as ExecFrame;
		if (f.done) {
			last = f;
			return;
		}
		const bytes = f.data_b64 !== undefined ? Buffer.from(f.data_b64, "base64") : Buffer.from(f.data ?? "", "utf8");
		(f.stream === "stderr" ? errs : out).push(bytes);
		opts.onData?.(bytes);
	};
	await new Promise<void>((resolve, reject) => {
		res.setEncoding("utf8");
		res.on("data", (chunk: string) => {
			rest += chunk;
			let nl = rest.indexOf("\n");
			while (nl >= 0) {
				frame(rest.slice(0, nl));
				rest = rest.slice(nl + 1);
				nl = rest.indexOf("\n");
			}
		});
		res.on("end", () => {
			frame(rest);
			resolve();
		});
		res.on("error", (err) => reject(opts.signal?.aborted ? new Error("aborted") : err));
		res.on("aborted", () => reject(new Error("aborted")));
	});
	if (!last) throw new ThermiteError("thermite: the exec's answer ended before its last frame");
	return { stdout: Buffer.concat(out), stderr: Buffer.concat(errs), last };
}

/**
 * A small shell script run as the lane with its arguments ($1...): what
 * the tools do outside the workspace, where the lane's own access decides.
 * A non-zero status is a refusal holding the command's own error.
 */
async function laneSh(script: string, args: string[], stdin?: Buffer, signal?: AbortSignal): Promise<Buffer> {
	const r = await laneExec(["sh", "-c", script, "sh", ...args], { stdin, signal });
	if (r.last.exit_code !== 0 || r.last.error) {
		const why = r.stderr.toString("utf8").trim() || r.last.error || `exit status ${r.last.exit_code}`;
		throw new ThermiteError(why);
	}
	return r.stdout;
}

// ---------------------------------------------------------------------------
// The trial's workspace, and paths in it.

let trialInfo: Promise<TrialInfo> | undefined;

/** The trial, asked of the API once (a refusal is asked again next time). */
function trial(): Promise<TrialInfo> {
	if (!trialInfo) {
		trialInfo = call<TrialInfo>("/v1/trial");
		trialInfo.catch(() => {
			trialInfo = undefined;
		});
	}
	return trialInfo;
}

/** A path's place relative to the workspace: "" is the workspace, undefined is outside it. */
function inWorkspace(ws: string, p: string): string | undefined {
	const rel = path.relative(ws, path.resolve(ws, p));
	if (rel === "") return "";
	if (rel === ".." || rel.startsWith("../") || path.isAbsolute(rel)) return undefined;
	return rel;
}

// ---------------------------------------------------------------------------
// The file operations Pi's tools call, through the API.

/** lanefs.Entry */
interface Entry {
	name: string;
	type: "file" | "dir" | "symlink" | "other";
	size: number;
}

const PNG = [0x89, 0x50, 0x4e, 0x47];
const JPEG = [0xff, 0xd8, 0xff];

/** The image types Pi's read sends as images, from a file's first bytes. */
function imageType(b: Buffer): string | null {
	const starts = (sig: number[]) => sig.every((v, i) => b[i] === v);
	if (starts(PNG)) return "image/png";
	if (starts(JPEG)) return "image/jpeg";
	if (b.subarray(0, 4).toString("latin1") === "GIF8") return "image/gif";
	if (b.subarray(0, 4).toString("latin1") === "RIFF" && b.subarray(8, 12).toString("latin1") === "WEBP") return "image/webp";
	return null;
}

/** Files as the lane sees them: the file helper in the workspace, lane commands elsewhere. */
class LaneFiles {
	/** Entry types a listing saw, so that ls's stat of each entry asks nothing more. */
	private seen = new Map<string, string>();

	constructor(
		private ws: string,
		private signal?: AbortSignal,
	) {}

	private rel(p: string): string | undefined {
		return inWorkspace(this.ws, p);
	}

	async read(p: string, limit?: number): Promise<Buffer> {
		const rel = this.rel(p);
		if (rel === undefined) {
			return limit ? laneSh('head -c "$2" -- "$1"', [p, String(limit)], undefined, this.signal) : laneSh('cat -- "$1"', [p], undefined, this.signal);
		}
		const parts: Buffer[] = [];
		let offset = 0;
		for (;;) {
			const r = await call<{ data: string | null; size: number; truncated: boolean }>(
				"/v1/fs/read",
				{ path: rel, offset, ...(limit ? { limit } : {}) },
				this.signal,
			);
			const b = Buffer.from(r.data ?? "", "base64");
			parts.push(b);
			offset += b.length;
			if (!r.truncated || limit || b.length === 0) break;
		}
		return Buffer.concat(parts);
	}

	/** The entry's type, or undefined where there is none; any other refusal is thrown. */
	async type(p: string): Promise<string | undefined> {
		const known = this.seen.get(path.resolve(this.ws, p));
		if (known) return known;
		const rel = this.rel(p);
		if (rel === undefined) {
			const t = (await laneSh('if [ -d "$1" ]; then echo dir; elif [ -e "$1" ] || [ -L "$1" ]; then echo file; else echo none; fi', [p], undefined, this.signal))
				.toString()
				.trim();
			return t === "none" ? undefined : t;
		}
		try {
			const e = await call<Entry>("/v1/fs/stat", { path: rel }, this.signal);
			return e.type;
		} catch (err) {
			if (codeOf(err) === "not_found") return undefined;
			throw err;
		}
	}

	/** That the lane can open the file for reading (the lane's own refusal otherwise). */
	async access(p: string): Promise<void> {
		const rel = this.rel(p);
		if (rel === undefined) {
			await laneSh('head -c 0 -- "$1"', [p], undefined, this.signal);
			return;
		}
		await call("/v1/fs/read", { path: rel, limit: 1 }, this.signal);
	}

	async write(p: string, content: Buffer): Promise<void> {
		const rel = this.rel(p);
		if (rel === undefined) {
			await laneSh('cat > "$1"', [p], content, this.signal);
			return;
		}
		if (rel === "") throw new ThermiteError(`${p}: is the workspace, a folder`);
		await call("/v1/fs/write", { path: rel, data: content.toString("base64"), create_parents: true }, this.signal);
	}

	async mkdir(p: string): Promise<void> {
		const rel = this.rel(p);
		if (rel === undefined) {
			await laneSh('mkdir -p -- "$1"', [p], undefined, this.signal);
			return;
		}
		if (rel === "") return;
		await call("/v1/fs/mkdir", { path: rel, parents: true }, this.signal);
	}

	async list(p: string): Promise<string[]> {
		const dir = path.resolve(this.ws, p);
		const rel = this.rel(p);
		let entries: { name: string; type: string }[];
		if (rel === undefined) {
			const out = await laneSh('find "$1" -mindepth 1 -maxdepth 1 -printf "%y %f\\0"', [p], undefined, this.signal);
			entries = out
				.toString("utf8")
				.split("\0")
				.filter((s) => s.length > 2)
				.map((s) => ({ name: s.slice(2), type: s[0] === "d" ? "dir" : "file" }));
		} else {
			entries = (await call<{ entries: Entry[] | null }>("/v1/fs/list", { path: rel }, this.signal)).entries ?? [];
		}
		for (const e of entries) this.seen.set(path.join(dir, e.name), e.type);
		return entries.map((e) => e.name);
	}

	/** Every path below a folder (absolute), folders first as a walk gives them. */
	async walk(p: string): Promise<string[]> {
		const rel = this.rel(p);
		if (rel === undefined) {
			const out = await laneSh('find "$1" -mindepth 1 -print0', [p], undefined, this.signal);
			return out.toString("utf8").split("\0").filter(Boolean);
		}
		const r = await call<{ paths: string[] | null }>("/v1/fs/find", { path: rel, max: 100000 }, this.signal);
		return (r.paths ?? []).map((q) => path.join(this.ws, q));
	}
}

function readOps(files: LaneFiles): ReadOperations {
	return {
		readFile: (p) => files.read(p),
		access: (p) => files.access(p),
		detectImageMimeType: async (p) => imageType(await files.read(p, 16)),
	};
}

function writeOps(files: LaneFiles): WriteOperations {
	return {
		writeFile: (p, content) => files.write(p, Buffer.from(content, "utf8")),
		mkdir: (dir) => files.mkdir(dir),
	};
}

function editOps(files: LaneFiles): EditOperations {
	return {
		readFile: (p) => files.read(p),
		writeFile: (p, content) => files.write(p, Buffer.from(content, "utf8")),
		access: (p) => files.access(p),
	};
}

function lsOps(files: LaneFiles): LsOperations {
	return {
		exists: async (p) => (await files.type(p)) !== undefined,
		stat: async (p) => {
			const t = await files.type(p);
			if (t === undefined) throw new ThermiteError(`${p}: no such file or folder`);
			return { isDirectory: () => t === "dir" };
		},
		readdir: (p) => files.list(p),
	};
}

/** A glob as Pi's find and grep take it ("*.ts", "**\/*.json", "src/{a,b}/*") as a regular expression. */
function globRegExp(glob: string): RegExp {
	let re = "";
	let braces = 0;
	for (let i = 0; i < glob.length; i++) {
		const c = glob[i];
		if (c === "*" && glob[i + 1] === "*") {
			const slash = glob[i + 2] === "/";
			re += slash ? "(?:.*/)?" : ".*";
			i += slash ? 2 : 1;
		} else if (c === "*") re += "[^/]*";
		else if (c === "?") re += "[^/]";
		else if (c === "{") {
			braces++;
			re += "(?:";
		} else if (c === "}" && braces > 0) {
			braces--;
			re += ")";
		} else if (c === "," && braces > 0) re += "|";
		else if (c === "[") {
			const end = glob.indexOf("]", i + 1);
			if (end < 0) re += "\\[";
			else {
				re += `[${glob.slice(i + 1, end).replace(/^!/, "^").replace(/\\/g, "\\\\")}]`;
				i = end;
			}
		} else re += c.replace(/[.+^$()|{}\\]/g, "\\$&");
	}
	return new RegExp(`^${re}$`);
}

/** Whether a path below a search folder matches a glob: by its name, or by the path when the glob has a slash. */
function globMatches(glob: RegExp, hasSlash: boolean, relPath: string): boolean {
	return glob.test(hasSlash ? relPath : path.basename(relPath));
}

function findOps(files: LaneFiles): FindOperations {
	return {
		exists: async (p) => (await files.type(p)) !== undefined,
		glob: async (pattern, cwd, { ignore, limit }) => {
			const re = globRegExp(pattern.replace(/^\.\//, ""));
			const skip = (ignore ?? []).map((g) => globRegExp(g));
			const out: string[] = [];
			for (const p of await files.walk(cwd)) {
				const rel = path.relative(cwd, p);
				if (skip.some((s) => s.test(rel) || s.test(`${rel}/`))) continue;
				if (globMatches(re, pattern.includes("/"), rel)) out.push(p);
				if (out.length >= limit) break;
			}
			return out;
		},
	};
}

/** Pi's bash tool's operation: the command run by bash as the lane in the workspace. */
function bashOps(ws: string): BashOperations {
	return {
		exec: async (command, cwd, { onData, signal, timeout }) => {
			// The environment Pi would give (agent-N's, with its token file) is
			// not passed on: the lane's command gets the lane's.
			// Pi's own working folder (a `!cmd`'s) is agent-N's, which stands
			// for the workspace; the bash tool's is the workspace already.
			const dir = inWorkspace(ws, cwd);
			const r = await laneExec(["bash", "-c", command], {
				cwd: dir,
				timeoutMs: timeout && timeout > 0 ? timeout * 1000 : undefined,
				signal,
				onData,
			});
			const f = r.last;
			if (signal?.aborted) throw new Error("aborted");
			if (f.stopped === "timeout") throw new Error(`timeout:${timeout}`);
			if (f.error) onData(Buffer.from(`\nthermite: ${f.error}\n`));
			if (f.truncated) onData(Buffer.from("\n[thermite: output past the lane's output cap was cut]\n"));
			if (f.stopped && !["exited", "signaled"].includes(f.stopped)) onData(Buffer.from(`\n[thermite: stopped: ${f.stopped}]\n`));
			return { exitCode: f.signal ? 128 + f.signal : (f.exit_code ?? null) };
		},
	};
}

// ---------------------------------------------------------------------------
// grep: Pi's runs ripgrep locally, so this one is thermite's own, with
// Pi's parameters and output (path:line: text), over the file helper's grep
// (Go regular expressions) in the workspace and grep -E elsewhere.

const GREP_DEFAULT_LIMIT = 100;

/** A literal string as a regular expression (Go's RE2 and POSIX ERE alike). */
function quoteMeta(s: string): string {
	return s.replace(/[\\.+*?()|[\]{}^$]/g, "\\$&");
}

interface GrepMatch {
	file: string; // absolute
	line: number;
	text: string;
}

async function laneGrep(
	files: LaneFiles,
	ws: string,
	search: string,
	params: { pattern: string; glob?: string; ignoreCase?: boolean; literal?: boolean; limit: number },
	signal?: AbortSignal,
): Promise<GrepMatch[]> {
	const pattern = params.literal ? quoteMeta(params.pattern) : params.pattern;
	// The glob is matched here, as find's is ("**" too), on the path below
	// the search folder: the file helper's and grep's own take less.
	const glob = params.glob ? globRegExp(params.glob.replace(/^\.\//, "")) : undefined;
	const wanted = (file: string) => !glob || globMatches(glob, params.glob!.includes("/"), path.relative(search, file) || path.basename(file));
	const rel = inWorkspace(ws, search);
	let matches: GrepMatch[] = [];
	if (rel !== undefined) {
		const r = await call<{ matches: { path: string; line_no: number; line: string }[] | null }>(
			"/v1/fs/grep",
			{ path: rel, pattern: params.ignoreCase ? `(?i)${pattern}` : pattern, max_matches: glob ? 10000 : params.limit },
			signal,
		);
		matches = (r.matches ?? []).map((m) => ({ file: path.join(ws, m.path), line: m.line_no, text: m.line }));
	} else {
		const flags = `-rnHZE${params.ignoreCase ? "i" : ""}`;
		const include = params.glob && !params.glob.includes("/") ? [`--include=${params.glob}`] : [];
		const r = await laneExec(["grep", flags, ...include, "-e", pattern, "--", search], { signal });
		for (const row of r.stdout.toString("utf8").split("\n")) {
			const nul = row.indexOf("\0");
			if (nul < 0) continue;
			const rest = row.slice(nul + 1);
			const colon = rest.indexOf(":");
			matches.push({ file: row.slice(0, nul), line: Number(rest.slice(0, colon)), text: rest.slice(colon + 1) });
		}
		if (matches.length === 0 && r.last.exit_code !== 0 && r.last.exit_code !== 1) {
			throw new ThermiteError(r.stderr.toString("utf8").trim() || `grep: exit status ${r.last.exit_code}`);
		}
	}
	return matches.filter((m) => wanted(m.file)).slice(0, params.limit);
}

function grepTool(ws: () => Promise<string>) {
	const base = createGrepToolDefinition(process.cwd());
	return {
		...base,
		description: base.description.replace("Respects .gitignore. ", "Patterns are Go (RE2) regular expressions in the workspace. "),
		promptSnippet: "Search file contents for patterns",
		async execute(
			_id: string,
			params: { pattern: string; path?: string; glob?: string; ignoreCase?: boolean; literal?: boolean; context?: number; limit?: number },
			signal?: AbortSignal,
		) {
			const root = await ws();
			const files = new LaneFiles(root, signal);
			const search = path.resolve(root, (params.path || ".").replace(/^@/, ""));
			const kind = await files.type(search);
			if (kind === undefined) throw new ThermiteError(`Path not found: ${search}`);
			const limit = Math.max(1, params.limit ?? GREP_DEFAULT_LIMIT);
			// One more than the limit says whether the limit was reached.
			const matches = await laneGrep(files, root, search, { ...params, limit: limit + 1 }, signal);
			if (matches.length === 0) return { content: [{ type: "text" as const, text: "No matches found" }], details: undefined };
			const limited = matches.length > limit;
			const shown = matches.slice(0, limit);
			const show = (file: string) => (kind === "dir" ? path.relative(search, file) : path.basename(file));
			const context = params.context && params.context > 0 ? params.context : 0;
			const cache = new Map<string, string[]>();
			let linesTruncated = false;
			const lines: string[] = [];
			const cut = (s: string) => {
				const t = truncateLine(s.replace(/\r/g, ""));
				if (t.wasTruncated) linesTruncated = true;
				return t.text;
			};
			for (const m of shown) {
				if (context === 0) {
					lines.push(`${show(m.file)}:${m.line}: ${cut(m.text)}`);
					continue;
				}
				let text = cache.get(m.file);
				if (!text) {
					text = (await files.read(m.file).catch(() => Buffer.alloc(0))).toString("utf8").split("\n");
					cache.set(m.file, text);
				}
				for (let n = Math.max(1, m.line - context); n <= Math.min(text.length, m.line + context); n++) {
					lines.push(n === m.line ? `${show(m.file)}:${n}: ${cut(text[n - 1] ?? "")}` : `${show(m.file)}-${n}- ${cut(text[n - 1] ?? "")}`);
				}
			}
			const truncation = truncateHead(lines.join("\n"), { maxLines: Number.MAX_SAFE_INTEGER });
			let output = truncation.content;
			const details: { matchLimitReached?: number; truncation?: typeof truncation; linesTruncated?: boolean } = {};
			const notices: string[] = [];
			if (limited) {
				notices.push(`${limit} matches limit reached. Use limit=${limit * 2} for more, or refine pattern`);
				details.matchLimitReached = limit;
			}
			if (truncation.truncated) {
				notices.push(`${formatSize(DEFAULT_MAX_BYTES)} limit reached`);
				details.truncation = truncation;
			}
			if (linesTruncated) {
				notices.push("Some lines truncated. Use read tool to see full lines");
				details.linesTruncated = true;
			}
			if (notices.length > 0) output += `\n\n[${notices.join(". ")}]`;
			return { content: [{ type: "text" as const, text: output }], details: Object.keys(details).length > 0 ? details : undefined };
		},
	};
}

// ---------------------------------------------------------------------------
// The research tools: the trial client's MCP tools of the same names
// (internal/trialclient/mcp.go), with the same parameters and answers.

/** lanefs.Match */
interface Match {
	path: string;
	line_no: number;
	line: string;
}

/** A tool of its own: its answer is text for the model, a refusal is thrown (Pi's tool error). */
function researchTool<P>(
	pi: ExtensionAPI,
	name: string,
	label: string,
	description: string,
	parameters: unknown,
	run: (params: P, signal?: AbortSignal) => Promise<string>,
) {
	pi.registerTool({
		name,
		label,
		description,
		promptSnippet: description,
		parameters,
		async execute(_id: string, params: P, signal?: AbortSignal) {
			return { content: [{ type: "text" as const, text: await run(params, signal) }], details: undefined };
		},
	} as any);
}

function researchTools(pi: ExtensionAPI) {
	const where = "the run's research folder";
	researchTool<{ title?: string; body: string }>(
		pi,
		"research_note",
		"Research note",
		"Write a research note every lane of the run can read.",
		Type.Object({
			title: Type.Optional(Type.String({ description: "the note's title" })),
			body: Type.String({ description: "the note, in Markdown" }),
		}),
		async (p, signal) => `noted: research_read ${(await call<{ path: string }>("/v1/research/note", { title: p.title ?? "", body: p.body }, signal)).path}`,
	);
	researchTool<{ url: string }>(
		pi,
		"research_fetch",
		"Fetch",
		"Fetch a public web page into the run's research folder (private and local addresses are refused).",
		Type.Object({ url: Type.String({ description: "an http or https URL of a public page" }) }),
		async (p, signal) => {
			const r = await call<{ url: string; status: number; size: number; content_type: string; path: string }>("/v1/fetch", { url: p.url }, signal);
			return `${r.url}: ${r.status}, ${r.size} bytes of ${r.content_type}; research_read ${r.path}`;
		},
	);
	researchTool<{ path: string; offset?: number; limit?: number }>(
		pi,
		"research_read",
		"Read research",
		`Read a file of ${where} (text; bytes that are not UTF-8 are named, not shown).`,
		Type.Object({
			path: Type.String({ description: "the file, relative to the research folder" }),
			offset: Type.Optional(Type.Number({ description: "the byte to start at" })),
			limit: Type.Optional(Type.Number({ description: "at most this many bytes" })),
		}),
		async (p, signal) => {
			const r = await call<{ data: string | null; size: number; truncated: boolean }>("/v1/research/read", p, signal);
			let text: string;
			try {
				text = new TextDecoder("utf-8", { fatal: true }).decode(Buffer.from(r.data ?? "", "base64"));
			} catch {
				text = `(not UTF-8 text: ${r.size} bytes)`;
			}
			return r.truncated ? `${text}\n(cut: the file has ${r.size} bytes; read on with offset)` : text;
		},
	);
	researchTool<{ path?: string }>(
		pi,
		"research_list",
		"List research",
		`List a folder of ${where}.`,
		Type.Object({ path: Type.Optional(Type.String({ description: "the folder, relative to the research folder" })) }),
		async (p, signal) => {
			const r = await call<{ entries: Entry[] | null; truncated: boolean }>("/v1/research/list", { path: p.path ?? "" }, signal);
			const lines = (r.entries ?? []).map((e) => `${e.type.padEnd(7)} ${String(e.size).padStart(10)}  ${e.name}`);
			if (r.truncated) lines.push("(more entries left out)");
			return lines.join("\n");
		},
	);
	researchTool<{ pattern: string; path?: string; glob?: string; max_matches?: number }>(
		pi,
		"research_grep",
		"Search research",
		`Search the files of ${where} for a regular expression (Go RE2).`,
		Type.Object({
			pattern: Type.String({ description: "a regular expression (Go RE2)" }),
			path: Type.Optional(Type.String({ description: "a folder or file, relative to the research folder" })),
			glob: Type.Optional(Type.String({ description: "only files whose name matches this glob" })),
			max_matches: Type.Optional(Type.Number({ description: "at most this many matches" })),
		}),
		async (p, signal) => {
			const r = await call<{ matches: Match[] | null; truncated: boolean }>("/v1/research/grep", { ...p, path: p.path ?? "" }, signal);
			const lines = (r.matches ?? []).map((m) => `${m.path}:${m.line_no}:${m.line}`);
			if (lines.length === 0) return "no match";
			if (r.truncated) lines.push("(more matches left out)");
			return lines.join("\n");
		},
	);
	researchTool<{ path?: string; glob?: string; max?: number }>(
		pi,
		"research_find",
		"Find research",
		`Find files of ${where} by a glob.`,
		Type.Object({
			path: Type.Optional(Type.String({ description: "a folder, relative to the research folder" })),
			glob: Type.Optional(Type.String({ description: "only paths whose name matches this glob" })),
			max: Type.Optional(Type.Number({ description: "at most this many paths" })),
		}),
		async (p, signal) => {
			const r = await call<{ paths: string[] | null; truncated: boolean }>("/v1/research/find", { ...p, path: p.path ?? "" }, signal);
			return (r.paths ?? []).join("\n");
		},
	);
	researchTool<{ kind: string; text?: string }>(
		pi,
		"step",
		"Step",
		"Record one step of your work in the trial's record.",
		Type.Object({
			kind: Type.String({ description: "what kind of step: thought, plan, result, ..." }),
			text: Type.Optional(Type.String({ description: "what it was" })),
		}),
		async (p, signal) => `recorded ${(await call<{ recorded: number }>("/v1/steps", { kind: p.kind, text: p.text ?? "" }, signal)).recorded} bytes`,
	);
}

// ---------------------------------------------------------------------------
// The tools.

export default function thermite(pi: ExtensionAPI) {
	// The workspace, or the refusal every tool then answers with.
	const workspace = async () => (await trial()).workspace;
	const here = process.cwd();

	/**
	 * A built-in tool whose operations go through the API: Pi's own
	 * definition (its parameters, output, truncation and rendering), made
	 * for the workspace, with this extension's operations.
	 */
	function override<D extends { execute: (...a: any[]) => any }>(make: (cwd: string, files?: LaneFiles) => D, snippet?: string) {
		const base = make(here);
		pi.registerTool({
			...base,
			...(snippet ? { promptSnippet: snippet } : {}),
			async execute(id: string, params: any, signal: AbortSignal | undefined, onUpdate: any, ctx: any) {
				const ws = await workspace();
				return make(ws, new LaneFiles(ws, signal)).execute(id, params, signal, onUpdate, ctx);
			},
		} as any);
	}

	override((cwd, f) => createReadToolDefinition(cwd, f && { operations: readOps(f) }));
	override((cwd, f) => createWriteToolDefinition(cwd, f && { operations: writeOps(f) }));
	override((cwd, f) => createEditToolDefinition(cwd, f && { operations: editOps(f) }));
	override((cwd, f) => createBashToolDefinition(cwd, f && { operations: bashOps(cwd) }));
	override((cwd, f) => createLsToolDefinition(cwd, f && { operations: lsOps(f) }));
	override((cwd, f) => {
		const find = createFindToolDefinition(cwd, f && { operations: findOps(f) });
		return { ...find, description: find.description.replace("Respects .gitignore. ", "Leaves out node_modules and .git. ") };
	}, "Find files by glob pattern");
	pi.registerTool(grepTool(workspace) as any);
	researchTools(pi);

	// The user's `!cmd` runs as the lane too.
	pi.on("user_bash", async () => {
		const ws = await workspace();
		return { operations: bashOps(ws) };
	});

	// The model's working directory is the workspace, not agent-N's folder.
	pi.on("before_agent_start", async (event) => {
		let ws: string;
		try {
			ws = await workspace();
		} catch {
			return;
		}
		return {
			systemPrompt: event.systemPrompt.split(`Current working directory: ${here}`).join(
				`Current working directory: ${ws} (the trial's workspace; every tool acts there as the lane's user, through thermite)`,
			),
		};
	});
}
