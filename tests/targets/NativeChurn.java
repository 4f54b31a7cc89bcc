import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.PrintWriter;
import java.lang.management.BufferPoolMXBean;
import java.lang.management.ManagementFactory;
import java.lang.reflect.Field;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;
import java.util.zip.DataFormatException;
import java.util.zip.Deflater;
import java.util.zip.Inflater;
import sun.misc.Unsafe;

/**
 * A JVM service that churns native memory from many threads, with a health check.
 *
 * <p>Usage: java NativeChurn [THREADS [RING [BURST]]] (defaults 16, 6 and 24). java.util.zip's Deflater and
 * Inflater keep their zlib state in memory that zlib mallocs in native code (a deflate state is
 * ~260 KiB at the default settings), so each worker thread fills its own glibc arena. Every
 * worker keeps RING live Deflaters and RING off-heap blocks (Unsafe.allocateMemory, which is
 * malloc) of random sizes up to 320 KiB, and replaces one of each per round: native chunks of
 * mixed sizes and ages are freed and reused all the time while the total stays steady. Each
 * round compresses generated data, parks it in the new off-heap block, and inflates it back
 * with a fresh Inflater; a round trip that does not give the input back counts as an error.
 * Before the churn each worker makes a burst of BURST Deflaters and ends all but every sixth,
 * as a spike of work does: the arenas keep that memory free, resident and steady.
 *
 * Each round also makes a direct ByteBuffer and drops the previous one: their native memory
 * is freed by the JVM's Cleaner thread after a GC, in bulk, from another thread than the one
 * that made it, so free memory swings by tens of MiB and heaps grow and shrink.
 *
 * <p>Health check: a TCP listener on 127.0.0.1 (kernel-chosen port, printed as "ready
 * port=N"); every line received is answered "pong ops=N errors=E". The line "direct off"
 * stops the direct buffers and collects the dropped ones before it answers (free memory then
 * stays steady), "direct on" resumes them.
 */
public final class NativeChurn {
    private static final AtomicLong OPERATIONS = new AtomicLong();
    private static final AtomicLong ERRORS = new AtomicLong();
    private static final int KEEP_EVERY = 6;
    private static final AtomicBoolean DIRECT = new AtomicBoolean(true);
    private static final AtomicLong DROPPED = new AtomicLong(); // workers without direct buffers
    private static final int JDK_DIRECT_BUFFERS = 8; // temporary buffers the JDK's I/O caches

    private static final Unsafe UNSAFE = unsafe();
    private static final long BYTES = Unsafe.ARRAY_BYTE_BASE_OFFSET;

    private NativeChurn() {}

    private static Unsafe unsafe() {
        try {
            Field field = Unsafe.class.getDeclaredField("theUnsafe");
            field.setAccessible(true);
            return (Unsafe) field.get(null);
        } catch (ReflectiveOperationException e) {
            throw new IllegalStateException(e);
        }
    }

    private static long directBuffers() {
        for (BufferPoolMXBean pool : ManagementFactory.getPlatformMXBeans(BufferPoolMXBean.class)) {
            if (pool.getName().equals("direct")) {
                return pool.getCount();
            }
        }
        return 0;
    }

    private static byte[] payload(Random random) {
        // Compressible but not trivial: words from a small alphabet with random lengths.
        byte[] data = new byte[8192 + random.nextInt(57344)];
        for (int i = 0; i < data.length; i++) {
            data[i] = (byte) ('a' + random.nextInt(6) + ((i / 64) % 3));
        }
        return data;
    }

    private static boolean roundTrip(Deflater deflater, byte[] input, long[] block, int slack)
            throws DataFormatException {
        deflater.reset();
        deflater.setInput(input);
        deflater.finish();
        byte[] packed = new byte[input.length + 1024];
        int packedLength = 0;
        while (!deflater.finished()) {
            packedLength += deflater.deflate(packed, packedLength, packed.length - packedLength);
        }
        // Park the compressed bytes off-heap, as a native cache would: a malloced block of
        // its own size, freed when the next round replaces it (not whenever a GC runs).
        if (block[0] != 0) {
            UNSAFE.freeMemory(block[0]);
        }
        block[0] = UNSAFE.allocateMemory(packedLength + slack);
        UNSAFE.copyMemory(packed, BYTES, null, block[0], packedLength);
        byte[] parked = new byte[packedLength];
        UNSAFE.copyMemory(null, block[0], parked, BYTES, packedLength);
        Inflater inflater = new Inflater();
        try {
            inflater.setInput(parked);
            byte[] output = new byte[input.length];
            int outputLength = 0;
            while (!inflater.finished() && outputLength < output.length) {
                outputLength += inflater.inflate(output, outputLength, output.length - outputLength);
            }
            return outputLength == input.length && Arrays.equals(output, input);
        } finally {
            inflater.end(); // frees zlib's native inflate state now, not at GC
        }
    }

    private static void work(int id, int ring, int burst) {
        Random random = new Random(id);
        // The burst: many Deflaters at once (a batch job, a traffic spike), then all ended but
        // every KEEP_EVERY-th, which stays for good (a pool). Their native states leave holes
        // between the kept ones: free memory that stays resident until a trim.
        Deflater[] spike = new Deflater[burst];
        for (int i = 0; i < burst; i++) {
            spike[i] = new Deflater(1 + random.nextInt(9));
        }
        List<Deflater> pool = new ArrayList<>();
        for (int i = 0; i < burst; i++) {
            if (i % KEEP_EVERY == 0) {
                pool.add(spike[i]);
            } else {
                spike[i].end();
            }
        }
        Deflater[] live = new Deflater[ring];
        long[][] blocks = new long[ring][1];
        ByteBuffer[] direct = new ByteBuffer[ring];
        boolean dropped = false;
        for (int i = 0; i < ring; i++) {
            live[i] = new Deflater(1 + random.nextInt(9));
        }
        int next = 0;
        while (true) {
            try {
                int slack = random.nextInt(262144);
                Deflater deflater = (next % 2 == 0) ? live[next] : pool.get(next % pool.size());
                if (!roundTrip(deflater, payload(random), blocks[next], slack)) {
                    ERRORS.incrementAndGet();
                }
                live[next].end(); // native deflate state freed, a new one malloced below
                live[next] = new Deflater(1 + random.nextInt(9));
                // A direct buffer per round, dropped at the next: the JVM frees its native
                // memory from the Cleaner thread after a GC, in bulk and not from the thread
                // that made it. "direct off" stops this, and the free memory settles.
                if (DIRECT.get()) {
                    direct[next] = ByteBuffer.allocateDirect(4096 + random.nextInt(61440));
                    dropped = false;
                } else if (!dropped) {
                    Arrays.fill(direct, null);
                    dropped = true;
                    DROPPED.incrementAndGet();
                }
                next = (next + 1) % ring;
                OPERATIONS.incrementAndGet();
                Thread.sleep(2); // busy, not a CPU hog on a shared machine
            } catch (DataFormatException e) {
                ERRORS.incrementAndGet();
            } catch (InterruptedException e) {
                return;
            }
        }
    }

    public static void main(String[] args) throws Exception {
        int threads = args.length > 0 ? Integer.parseInt(args[0]) : 16;
        int ring = args.length > 1 ? Integer.parseInt(args[1]) : 6;
        int burst = args.length > 2 ? Integer.parseInt(args[2]) : 24;
        try (ServerSocket server = new ServerSocket(0, 8, InetAddress.getLoopbackAddress())) {
            for (int t = 0; t < threads; t++) {
                final int id = t + 1;
                Thread worker = new Thread(() -> work(id, ring, burst), "churn-" + id);
                worker.setDaemon(true);
                worker.start();
            }
            while (OPERATIONS.get() < threads * 100L) { // past the warm-up (JIT, first GCs)
                Thread.sleep(5);
            }
            System.out.println("ready port=" + server.getLocalPort());
            System.out.flush();
            while (true) {
                try (Socket conn = server.accept();
                        BufferedReader in =
                                new BufferedReader(
                                        new InputStreamReader(
                                                conn.getInputStream(), StandardCharsets.US_ASCII));
                        PrintWriter out =
                                new PrintWriter(
                                        new OutputStreamWriter(
                                                conn.getOutputStream(), StandardCharsets.US_ASCII),
                                        true)) {
                    String line;
                    while ((line = in.readLine()) != null) {
                        if (line.equals("direct on")) {
                            DROPPED.set(0);
                            DIRECT.set(true);
                        } else if (line.equals("direct off")) {
                            DIRECT.set(false);
                            // Let every worker drop its last direct buffers, then collect:
                            // tenured ones would otherwise wait for a full GC, whenever.
                            long deadline = System.nanoTime() + 8_000_000_000L;
                            while (DROPPED.get() < threads && System.nanoTime() < deadline) {
                                Thread.sleep(10);
                            }
                            // Collect until the Cleaner has freed the workers' direct buffers
                            // (the JDK keeps a few of its own for socket I/O).
                            while (directBuffers() > JDK_DIRECT_BUFFERS
                                    && System.nanoTime() < deadline) {
                                System.gc();
                                Thread.sleep(20);
                            }
                        }
                        out.println("pong ops=" + OPERATIONS.get() + " errors=" + ERRORS.get());
                    }
                } catch (java.io.IOException e) {
                    // a client that went away mid-line: keep serving the next one
                }
            }
        }
    }
}
