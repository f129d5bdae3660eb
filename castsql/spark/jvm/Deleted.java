package castsql.spark.jvm;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashMap;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.broadcast.Broadcast;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.types.DataTypes;

/**
 * Is a row deleted? Its file (by size) and position (_metadata.row_index) tested
 * against the deleted positions of the files of one version, held as bitsets in a
 * broadcast. castsql.spark.read filters on it where this jar reaches the tasks
 * (SparkContext.addJar): one bit test a row, where the plan without it hash-joins
 * every row with a broadcast table of the bitsets (1.11-1.17x against 1.26-1.30x
 * a plain Parquet read, 20M rows, 1% deletes; the metadata columns alone cost
 * 1.07-1.11x: docs/PERFORMANCE.md).
 */
public final class Deleted implements UDF2<Long, Long, Boolean> {
    private final Broadcast<HashMap<Long, long[]>> bits;
    // A task reads one file at a time: its bitset is looked up once per file.
    private transient long lastSize = Long.MIN_VALUE;
    private transient long[] lastWords;

    private Deleted(Broadcast<HashMap<Long, long[]>> bits) {
        this.bits = bits;
    }

    @Override
    public Boolean call(Long size, Long pos) {
        long s = size;
        if (s != lastSize) {
            lastWords = bits.value().get(s);
            lastSize = s;
        }
        long[] words = lastWords;
        long p = pos;
        int i = (int) (p >>> 6);
        return words != null && i < words.length && (words[i] & (1L << (p & 63))) != 0;
    }

    /**
     * The Column "this row is deleted", for the bitsets in blob: little-endian longs,
     * the number of files, then for each its size, its number of words and the words
     * (bit i of word j is row 64j + i).
     */
    public static Column column(SparkSession spark, byte[] blob, Column size, Column pos) {
        ByteBuffer b = ByteBuffer.wrap(blob).order(ByteOrder.LITTLE_ENDIAN);
        int files = Math.toIntExact(b.getLong());
        HashMap<Long, long[]> bits = new HashMap<>(files * 2);
        for (int f = 0; f < files; f++) {
            long fileSize = b.getLong();
            long[] words = new long[Math.toIntExact(b.getLong())];
            b.asLongBuffer().get(words);
            b.position(b.position() + words.length * 8);
            bits.put(fileSize, words);
        }
        Broadcast<HashMap<Long, long[]>> bc = JavaSparkContext.fromSparkContext(spark.sparkContext()).broadcast(bits);
        return functions.udf(new Deleted(bc), DataTypes.BooleanType).apply(size, pos);
    }
}
