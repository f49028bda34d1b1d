// Runs thermite's Pi extension's user_bash handler (a user's `!cmd`) the
// way Pi's interactive mode does: the handler's operations, then exec.
import { createRequire } from "node:module";
const [agents, extension, command, cwd] = process.argv.slice(2);
const require = createRequire(agents + "/node_modules/");
const { createJiti } = require("jiti");
const factory = await createJiti(import.meta.url).import(extension, { default: true });
const handlers = {};
factory({ registerTool() {}, on(name, h) { handlers[name] = h; } });
let output = "";
try {
	const r = await handlers.user_bash({ type: "user_bash", command, cwd, excludeFromContext: false });
	const res = await r.operations.exec(command, cwd, { onData: (b) => (output += b.toString()) });
	console.log(JSON.stringify({ output, exitCode: res.exitCode }));
} catch (err) {
	console.log(JSON.stringify({ output, error: String(err.message) }));
}
